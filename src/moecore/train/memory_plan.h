// Memory before work: the bytes one rank plans to hold while training (from the configuration and the layout
// alone, before anything is allocated) against the memory it may use (cgroup limit, MemAvailable, shared by the
// ranks on the node). A run that cannot fit is refused with the plan and what to change. Estimates, not
// measurements: fp32 weights, gradients and Adam moments, activations from what each layer's stash keeps.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

#include "moecore/train/config.h"

namespace moecore::train {

struct ParallelGroups;

// Bytes on one rank.
struct MemoryPlan {
  double weights = 0, grads = 0, adam = 0;
  double activations = 0;  // kept per micro-batch, all layers
  double logits = 0;       // one micro-batch's logits
  double total() const { return weights + grads + adam + activations + logits; }
  std::string describe() const;  // "weights 1.0 MiB | gradients ..."
};

// Parameters held by one rank: dense ones (embedding, attention, dense FFNs, router, shared experts) split over
// TP, routed experts over EP x ETP.
struct ParamCounts {
  double dense = 0, expert = 0;
};
// From the model's sizes (what build_model will create), before anything exists.
ParamCounts count_params(const TrainConfig& c, int64_t padded_vocab, int64_t tp, int64_t ep_etp);

// The plan for `p` with data-parallel sizes dp (dense) and edp (experts), which shard the Adam moments under
// --use-distributed-optimizer, and tensor parallel size tp (sequence- and vocabulary-parallel activations).
MemoryPlan plan_memory(const TrainConfig& c, const ParamCounts& p, int64_t padded_vocab, int64_t tp, int64_t dp,
                       int64_t edp);

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
