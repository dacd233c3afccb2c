// The step-time model of `moecore plan --plan-gpu`: one training step of a layout on a GPU, predicted from the
// flags alone. Each op class of every layer (dense GEMMs, the experts' grouped GEMMs at the rows each expert gets,
// attention, the memory-bound rest) at its achievable rate (gpu_specs.h), each group's communication from the cost
// model's bytes (observe/cost_model.h) over the links it crosses, hidden where Megatron overlaps it under the given
// flags; the pipeline's passes simulated in Megatron's order (1F1B, interleaved, uneven stages, layouts) to find
// the bubble; recompute's extra forward; the optimizer step. Predictions, not measurements (docs/plan.md says where
// the model is known to be wrong).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "moecore/train/config/config.h"
#include "moecore/train/memory_plan.h"
#include "moecore/train/plan/gpu_specs.h"

namespace moecore::train::plan {

// Seconds of one pass (forward or backward of one micro-batch through some layers) on one rank, by class;
// communication as exposed after the overlaps that act inside a layer.
struct OpTimes {
  double dense_gemm = 0, expert_gemm = 0, attention = 0, memory = 0;  // compute
  double launch = 0;  // the fixed cost of the kernels other than the GEMMs (a GEMM's is in its class)
  double tp = 0, ep = 0, etp = 0, cp = 0;  // exposed communication
  double compute() const { return dense_gemm + expert_gemm + attention + memory + launch; }
  double comm() const { return tp + ep + etp + cp; }
  double total() const { return compute() + comm(); }
  OpTimes& operator+=(const OpTimes& o);
  OpTimes operator*(double f) const;
};

// Options of the run that the flag table does not keep (Megatron flags moecore accepts without effect).
struct PlanOptions {
  bool tp_comm_overlap = false;  // --tp-comm-overlap: TP's all-gathers and reduce-scatters overlap the GEMMs
};

struct StepPrediction {
  double step_seconds = 0, tokens_per_second = 0;
  double flops = 0;                    // Megatron's num_floating_point_operations of one step
  double tflops_per_gpu = 0, mfu = 0;  // MFU against the BF16 dense peak
  int64_t critical_pp_rank = 0;        // the pipeline rank whose step is longest (the breakdown is its)
  // The critical rank's step, in seconds: compute by class (recompute included), exposed communication by group,
  // the pipeline bubble, the optimizer step.
  std::vector<std::pair<std::string, double>> compute, exposed_comm;
  double recompute = 0, bubble = 0, optimizer = 0;
  // The critical rank's host-GPU synchronizations in one step (the MoE dispatchers' token counts, recompute
  // included): the host cannot run ahead of the GPU past them. Counted, not priced.
  int64_t host_syncs = 0;
};

// One step of `c` under layout `l` on `gpu`. Throws Error for what the model does not cover (named).
StepPrediction predict_step(const TrainConfig& c, int64_t padded_vocab, const PlanLayout& l, const GpuSpec& gpu,
                            const PlanOptions& options = {});

// The pipeline's passes in Megatron's order (pipeline_order) with each pass's seconds, P2P latency `p2p` between
// stages: when each rank finishes. fwd[r][v], bwd[r][v]: one micro-batch through chunk v of rank r. combined:
// Megatron's combined 1F1B order (one warm-up forward more; each merged pair starts once both its messages came).
std::vector<double> simulate_pipeline(int64_t num_microbatches, int64_t pp, int64_t vpp, int64_t group,
                                      const std::vector<std::vector<double>>& fwd,
                                      const std::vector<std::vector<double>>& bwd, double p2p, bool combined = false);

// The printed prediction (moecore plan).
std::string describe(const StepPrediction& p, const GpuSpec& gpu, int64_t world);

}  // namespace moecore::train::plan
