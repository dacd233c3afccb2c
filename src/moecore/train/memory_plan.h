// Memory before work: the bytes one rank plans to hold while training (from the configuration and the layout
// alone, before anything is allocated) against the memory it may use (cgroup limit, MemAvailable, shared by the
// ranks on the node). A run that cannot fit is refused with the plan and what to change. Estimates, not
// measurements: weights (bf16 where stored so under --bf16), fp32 gradients, master weights and Adam moments,
// activations from what each layer's stash keeps.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "moecore/train/config/config.h"

namespace moecore::train {

struct ParallelGroups;

// The layout a plan is for: every group's size (world = TP·CP·PP·DP = ETP·EP·PP·EDP) and the micro-batches of
// one step on one data-parallel rank.
struct PlanLayout {
  int64_t tp = 1, cp = 1, pp = 1, dp = 1, ep = 1, etp = 1, edp = 1;
  int64_t num_microbatches = 1;
  int64_t world() const { return tp * cp * pp * dp; }
  // From the flags and a world size (0: the product of the layout flags, DP = 1).
  static PlanLayout from(const TrainConfig& c, int64_t world = 0);
};

// Bytes on one rank (one pipeline stage's rank).
struct MemoryPlan {
  int64_t pp_rank = 0;
  double params = 0;  // parameters held here
  // The model's parameters: f32, or under --bf16 bf16 where stored so (2 bytes) and f32 for the rest; bf16 copies
  // rounded per step (a tied output layer's weight) and the experts' packed copies (kernels::pack_weights_for).
  double weights = 0, bf16_weights = 0;
  double packed_weights = 0;               // of bf16_weights: the experts' packed copies
  double grads = 0, adam = 0, master = 0;  // f32 gradients (the buckets); Adam moments; the bf16 parameters' f32 master
  double comm = 0;                         // pipeline P2P buffers (gradients are reduced in place in their buckets)
  double fsdp_units = 0;                   // Megatron FSDP: the units' whole parameters and gradients in flight
  double activations = 0;                  // one micro-batch's stashes on this stage (all its chunks), no logits
  double logits = 0;                       // one micro-batch's logits stash (a last stage)
  double in_flight = 1;                    // micro-batches' stashes held at the schedule's peak (stage units)
  double peak_activations = 0;             // the stashes at the schedule's peak, logits included
  double working = 0;                      // on top, in backward: a replayed full-recompute chunk, one layer's grads
  // Fine-grained activation offloading (memory_plan_offload.cpp): one micro-batch's stash bytes the --offload-modules
  // move to host memory on this stage; the host bytes at the schedule's peak; the device bytes of the layers whose
  // tensors are on their way (being copied out, copied back, prefetched). peak_activations counts the device: the
  // stashes at the peak less host_offloaded, plus offload_window.
  double offloaded = 0, host_offloaded = 0, offload_window = 0;
  // Buffers by name (the EP dispatcher's, dispatch_buffers): itemized, already inside the totals above.
  struct Buffer {
    std::string name;
    double bytes = 0;
  };
  std::vector<Buffer> buffers;
  double total() const {
    return weights + bf16_weights + grads + adam + master + comm + fsdp_units + peak_activations + working;
  }
  // What a step allocates and frees again: the stashes at the schedule's peak and the backward's working set (the
  // bf16 weight copies stay allocated between steps: Bf16WeightScope keeps their buffers).
  double transient() const { return peak_activations + working; }
  std::string describe() const;  // "weights 1.0 MiB | gradients ..."
};

// Parameters held by one rank: dense ones (embedding, attention, dense FFNs, router, shared experts) split over
// TP, routed experts over EP x ETP.
struct ParamCounts {
  double dense = 0, expert = 0;
  // Of dense and expert: the parameters the model keeps in f32 under --bf16 (norms, biases, router, embeddings, a
  // tied output layer: read in f32 somewhere); the rest is stored in bf16, its f32 master in the optimizer.
  double f32_dense = 0, f32_expert = 0;
  // Elements rounded into a bf16 copy once per step under --bf16: a tied output layer's f32 weight.
  double bf16_copy = 0;
  // Megatron FSDP's units here: the largest transformer layer's parameters, and the embedding's, final norm's,
  // output layer's and MTP's (one unit), each with its part kept in f32 under --bf16.
  double largest_layer = 0, largest_layer_f32 = 0, ends = 0, ends_f32 = 0;
  // --fp8-param-gather: of dense and expert (not of the f32 ones), the FP8 sites' weights (nn/fp8_param.h), held
  // as f32 read-backs of their FP8 bytes with f32 masters apart; of the largest layer, its FP8 weights.
  double fp8_dense = 0, fp8_expert = 0, largest_layer_fp8 = 0;
};
// From the model's sizes (what build_model will create), before anything exists: the whole model, or the layers
// and ends of pipeline rank pp_rank (pp_rank >= 0).
ParamCounts count_params(const TrainConfig& c, int64_t padded_vocab, int64_t tp, int64_t ep_etp, int64_t pp_rank = -1);

// The device `c` plans a run on: a GPU for --device cuda[:N] (on any machine: moecore plan), or for auto where a
// GPU is visible; else the CPU.
Device planned_device(const TrainConfig& c);
// Whether that is a GPU.
bool plans_gpu(const TrainConfig& c);

// The plan of pipeline rank `pp_rank` under `l`: parameters counted from the configuration (or `measured`, the
// built model's), optimizer state by --use-distributed-optimizer, activations as the modules' stash_bytes
// (nn/stash_bytes.h) summed over the stage's layers, held for the micro-batches the schedule keeps in flight.
MemoryPlan plan_memory(const TrainConfig& c, int64_t padded_vocab, const PlanLayout& l, int64_t pp_rank,
                       const ParamCounts* measured = nullptr);
// Every pipeline rank's plan; the worst is the one with the largest total.
std::vector<MemoryPlan> plan_memory_stages(const TrainConfig& c, int64_t padded_vocab, const PlanLayout& l);
const MemoryPlan& worst_stage(const std::vector<MemoryPlan>& plans);

// Megatron FSDP (memory_plan_fsdp.cpp): what --data-parallel-sharding-strategy keeps of the weights, gradients,
// moments and masters (`m` planned as the distributed optimizer's), and the units' whole parameters and gradients
// in flight (with --fsdp-double-buffer its two buffers, kept for the run, in comm).
void apply_fsdp(const TrainConfig& c, const PlanLayout& l, const ParamCounts& p, MemoryPlan& m);
// Activations (memory_plan_activations.cpp): one micro-batch's stash bytes per model chunk of pipeline rank
// `pp_rank` (logits apart), and the bytes the schedule holds at its peak; the backward's working set.
struct StageActivations {
  std::vector<double> chunk_bytes;  // per model chunk (virtual stage), logits excluded
  double logits = 0;                // the last chunk's logits, on a last stage
  double peak = 0;                  // the schedule's peak of live stashes
  double in_flight = 1;             // peak / one micro-batch's stashes
  double working = 0;               // backward's working set on top of the stashes
};
StageActivations stage_activations(const TrainConfig& c, int64_t padded_vocab, const PlanLayout& l, int64_t pp_rank);
// Offloading (memory_plan_offload.cpp): one micro-batch's bytes the --offload-modules move to the host from the
// layers of pipeline rank `pp_rank` (0 when offloading is off or selects nothing on this run's device), and the
// largest of one layer's; applied to a plan whose activations are filled.
struct StageOffload {
  double per_micro_batch = 0, largest_layer = 0;
};
StageOffload stage_offload(const TrainConfig& c, int64_t padded_vocab, const PlanLayout& l, int64_t pp_rank);
void apply_activation_offload(const TrainConfig& c, int64_t padded_vocab, const PlanLayout& l, MemoryPlan& m);
// The expert-parallel dispatcher's buffers of one MoE layer, by name (memory_plan_dispatch.cpp): transient, inside
// the working set and stashes already counted; empty without EP or ETP.
std::vector<MemoryPlan::Buffer> dispatch_buffers(const TrainConfig& c, const PlanLayout& l);

// The memory this rank may use and where that figure comes from.
struct MemoryLimit {
  double bytes = 0;
  std::string source;
};
// The smaller of the cgroup's headroom (v2 memory.max − memory.current, or v1 memory.limit_in_bytes −
// memory.usage_in_bytes) and MemAvailable from /proc/meminfo, divided by the ranks on this node.
MemoryLimit detect_memory_limit(int64_t ranks_on_node);

// Throws Error with the plan and advice when `plan` exceeds `limit`.
void check_memory_fits(const TrainConfig& c, const MemoryPlan& plan, const MemoryLimit& limit);

// What the Trainer runs before it builds the datasets and the model: the plan from the configuration and `g`,
// the limit (--testing-memory-limit, or detected with the ranks on this node counted by an MPI shared-memory
// split: collective over g's world), the check; prints both to `out`. Returns the plan.
MemoryPlan check_memory_before_start(const TrainConfig& c, int64_t padded_vocab, const ParallelGroups& g,
                                     std::FILE* out);

}  // namespace moecore::train
