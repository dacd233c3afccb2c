// The GPUs `moecore plan` predicts a step for (--plan-gpu): each one's public specification (dense peaks, memory,
// links, GPUs per NVLink domain) and the achievable rates measured on it by public microbenchmarks. Figures only;
// what they are used for is step_time.h. Sources: docs/plan.md, one per figure.
#pragma once

#include <string>
#include <vector>

namespace moecore::train::plan {

struct GpuSpec {
  std::string name;  // "h100"
  std::string description;
  // Datasheet figures (dense, no sparsity), per GPU.
  double peak_bf16 = 0, peak_fp8 = 0;       // FLOP/s
  double hbm_bytes = 0, hbm_bandwidth = 0;  // bytes, bytes/s
  double nvlink_bandwidth = 0;              // bytes/s one direction
  double network_bandwidth = 0;             // bytes/s one direction (the GPU's own NIC)
  // Host <-> device copies (activation offloading), bytes/s one direction as a copy engine reaches them: PCIe Gen5
  // x16 on H100 / H200 / HGX B200, NVLink-C2C to the Grace CPU on GB200.
  double host_bandwidth = 0;
  int gpus_per_nvlink_domain = 8;
  // Achievable rates from public measurements (docs/plan.md, "Rates"): large GEMMs as a fraction of the peak
  // (MAMF), FlashAttention-3 / cuDNN attention forward and backward as a fraction of the BF16 peak, the fraction of
  // the HBM bandwidth a streaming kernel reaches, NCCL-tests' bus bandwidth inside the NVLink domain and across it.
  double gemm_bf16_efficiency = 0, gemm_fp8_efficiency = 0;
  // A GEMM below the large shapes MAMF is measured at: one kernel of [m, k] x [k, n] takes
  //   2mnk / (rate * k / (k + gemm_k_overhead)) + gemm_fixed_seconds,
  // the fixed part being its pipeline fill, tail and epilogue. Fitted once to the BF16 kernel times of a public
  // cuBLAS-class GEMM table (docs/plan.md, "Rates"); 0 for the CPU spec bench plan builds from measured rates.
  double gemm_k_overhead = 0, gemm_fixed_seconds = 0;
  // The share of that fixed part a grouped expert GEMM still pays per expert: TransformerEngine runs the experts'
  // GEMMs on several streams, which overlap one expert's tail with the next one's start.
  double grouped_gemm_fixed_share = 1;
  double attention_fwd_efficiency = 0, attention_bwd_efficiency = 0;
  double hbm_efficiency = 0;
  double nccl_busbw_nvlink = 0, nccl_busbw_network = 0;  // bytes/s, all-reduce / reduce-scatter / all-gather
  double alltoall_busbw_network = 0;                     // bytes/s, all-to-all across nodes (per GPU)
  double kernel_launch_seconds = 0;                      // fixed cost of one kernel (CUDA graphs: small)
  // Fixed cost of one collective call (NCCL's small-message latency; on the CPU, MPI's measured one), inside the
  // NVLink domain and across it; paid once per collective on top of its bytes over the bus bandwidth.
  double collective_latency_nvlink = 0, collective_latency_network = 0;  // seconds
  // Streaming multiprocessors, and those a communication kernel running beside compute takes from it (DeepEP and
  // HybridEP: Megatron-Bridge's recipes give HybridEP 32, DeepEP's own tests 24; NCCL's channels similar).
  double sms = 0, comm_sms = 0;
  // Measured seconds of one micro-batch's cross-entropy on this rank's logits, forward and backward (moecore bench
  // plan times moecore's CPU kernels at the model's shape: an exponential per logit makes them compute-bound there);
  // 0 for the GPUs above: the logits' bytes over the HBM bandwidth.
  double cross_entropy_fwd_seconds = 0, cross_entropy_bwd_seconds = 0;
  // Measured seconds of one micro-batch's output-layer GEMMs on this rank ([tokens, H] x [H, V/TP]: the forward;
  // the data and weight gradients), likewise 0 for the GPUs above (the GEMM rate at that shape).
  double output_layer_fwd_seconds = 0, output_layer_bwd_seconds = 0;
  // The fraction of its own duration a hidden (overlapped) communication still costs the compute beside it.
  double overlap_cost() const { return sms > 0 ? comm_sms / sms : 0; }
  double achievable_bf16() const { return peak_bf16 * gemm_bf16_efficiency; }
  double achievable_fp8() const { return peak_fp8 * gemm_fp8_efficiency; }
};

// The GPUs known by name; throws Error naming --plan-gpu and the names known for any other.
const GpuSpec& gpu_spec(const std::string& name);
std::vector<std::string> gpu_names();

}  // namespace moecore::train::plan
