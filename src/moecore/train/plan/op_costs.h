// The op classes of one layer, one micro-batch, one rank (step_time.h): the GEMMs as a roofline at their shapes
// (the achievable GEMM rate, the HBM bandwidth, a launch), attention at FlashAttention's achievable rate, the
// memory-bound rest as bytes over the HBM bandwidth, communication as the cost model's bytes over a bus bandwidth.
// Not the pipeline (step_time.cpp) and not the rates themselves (gpu_specs.cpp).
#pragma once

#include <cstdint>

#include "moecore/nn/recompute.h"
#include "moecore/train/config/config.h"
#include "moecore/train/memory_plan.h"
#include "moecore/train/plan/gpu_specs.h"
#include "moecore/train/plan/step_time.h"

namespace moecore::train::plan {

// Bus bandwidth (bytes/s) each group's collectives reach under the layout: NVLink where the group lies inside an
// NVLink domain (Megatron's rank order tp-cp-ep-dp-pp), the network where it spans domains; EP's all-to-all splits
// its bytes between the two by where its peers are.
struct Links {
  double tp = 0, cp = 0, dp = 0, pp = 0, ep = 0, etp = 0, edp = 0;
  // Each group's fixed cost of one collective (or P2P transfer): the NVLink latency inside a domain, the network's
  // across it (GpuSpec::collective_latency_*).
  struct Latency {
    double tp = 0, cp = 0, dp = 0, pp = 0, ep = 0, etp = 0, edp = 0;
  } latency;
};
Links links_of(const PlanLayout& l, const GpuSpec& gpu);

// Seconds of one GEMM kernel [m, k] x [k, n] at `rate` FLOP/s below the large shapes the rate is measured at: the
// contraction's overhead and the kernel's fixed part (GpuSpec); `grouped`: one expert's GEMM inside
// TransformerEngine's grouped GEMM. Compute only: no launch, no bytes.
double gemm_kernel_seconds(const GpuSpec& gpu, double m, double n, double k, double rate, bool grouped);

// Per-micro-batch communication bytes of one layer of each kind and direction, from the cost model's per-step
// bytes (analytic_comm_bytes) divided among the layers as its formula counts them.
struct LayerBytes {
  double tp_dense_layer = 0, tp_moe_layer = 0, tp_ends = 0;  // one direction
  double ep_moe_layer = 0, etp_moe_layer = 0;                // one direction
};
LayerBytes layer_bytes(const TrainConfig& c, const PlanLayout& l);

// One layer's passes: forward, backward, and what recompute adds to the backward.
struct LayerTimes {
  OpTimes fwd, bwd, recompute;
};
LayerTimes layer_times(const TrainConfig& c, const PlanLayout& l, const GpuSpec& gpu, const Links& links,
                       const LayerBytes& bytes, const PlanOptions& options, bool moe_layer, bool full_recompute);
// The embedding (first stage) and the output layer with the loss (last stage), and one MTP depth.
LayerTimes embedding_times(const TrainConfig& c, const PlanLayout& l, const GpuSpec& gpu);
LayerTimes loss_times(const TrainConfig& c, int64_t padded_vocab, const PlanLayout& l, const GpuSpec& gpu,
                      const Links& links, const LayerBytes& bytes, const PlanOptions& options);

// Host-GPU synchronizations of one MoE layer's forward for one micro-batch in Megatron: the dispatcher reads the
// token counts back to the host (the allgather dispatcher always; alltoall and flex's HybridEP unless drop-and-pad
// fixes the counts; DeepEP's dispatch always waits on the host for the received count). Not priced (docs/plan.md).
int64_t host_syncs_per_moe_forward(const TrainConfig& c);

// Seconds of the optimizer step over `params` elements held by this rank's optimizer (its shard).
double optimizer_seconds(const TrainConfig& c, double params, const GpuSpec& gpu);

}  // namespace moecore::train::plan
