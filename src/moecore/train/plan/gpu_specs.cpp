// The GPU table (see gpu_specs.h). Every figure's source is in docs/plan.md ("GPUs" and "Rates"); the same
// efficiencies are used for every model: calibrated once from microbenchmarks, never from training runs.
#include "moecore/train/plan/gpu_specs.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "moecore/core/error.h"

namespace moecore::train::plan {

namespace {

constexpr double T = 1e12, G = 1e9;

GpuSpec hopper(std::string name, std::string description, double hbm_gb, double hbm_tbs) {
  GpuSpec s;
  s.name = std::move(name);
  s.description = std::move(description);
  s.peak_bf16 = 989.4 * T;  // H100/H200 SXM datasheet, dense
  s.peak_fp8 = 1978.9 * T;
  s.hbm_bytes = hbm_gb * G;
  s.hbm_bandwidth = hbm_tbs * T;
  s.nvlink_bandwidth = 450 * G;  // NVLink 4: 900 GB/s bidirectional
  s.network_bandwidth = 50 * G;  // one ConnectX-7 400 Gb/s NIC per GPU (DGX H100 / H200)
  // PCIe Gen5 x16, 64 GB/s one way; nvbandwidth on H100 measures 52.8 (device to host) to 57 GB/s (docs/plan.md).
  s.host_bandwidth = 0.82 * 64 * G;
  s.gpus_per_nvlink_domain = 8;
  s.gemm_bf16_efficiency = 0.803;  // MAMF 794.5 of 989 TFLOPS (ml-engineering)
  s.gemm_fp8_efficiency = 0.734;   // MAMF 1453.4 of 1979 TFLOPS on H200 (ml-engineering)
  s.gemm_k_overhead = 24;          // fitted to XLA's sm_90 BF16 GEMM table (docs/plan.md)
  s.gemm_fixed_seconds = 6.2e-6;
  s.grouped_gemm_fixed_share = 0.6;   // TransformerEngine's grouped GEMM on H100, two published shapes (docs/plan.md)
  s.attention_fwd_efficiency = 0.60;  // FlashAttention-3, causal, head dim 128, 4k: ~600 TFLOPS forward
  s.attention_bwd_efficiency = 0.45;  // FlashAttention-3 backward, same shapes: ~450 TFLOPS
  s.hbm_efficiency = 0.85;            // streaming kernels reach ~85-90% of the HBM datasheet figure
  s.nccl_busbw_nvlink = 360 * G;      // nccl-tests all_reduce_perf, 8x H100 NVLink, large messages (no NVLS)
  s.nccl_busbw_network = 45 * G;      // nccl-tests across nodes, 400 Gb/s InfiniBand per GPU
  s.alltoall_busbw_network = 35 * G;  // nccl-tests alltoall_perf across nodes, 400 Gb/s per GPU
  s.kernel_launch_seconds = 4e-6;
  s.collective_latency_nvlink = 6e-6;  // nccl-tests all_reduce_perf, HGX 8x H100, small messages (NVIDIA/nccl#1259)
  s.collective_latency_network =
      25e-6;                     // NCCL's own tuning estimate, small all-reduce, H100 cluster (NVIDIA/nccl#1453)
  s.sms = 132, s.comm_sms = 32;  // H100/H200 SXM: 132 SMs
  return s;
}

GpuSpec blackwell(std::string name, std::string description, double peak_bf16_tflops, double hbm_gb, int domain) {
  GpuSpec s;
  s.name = std::move(name);
  s.description = std::move(description);
  s.peak_bf16 = peak_bf16_tflops * T;
  s.peak_fp8 = 2 * peak_bf16_tflops * T;
  s.hbm_bytes = hbm_gb * G;
  s.hbm_bandwidth = 8 * T;       // HBM3e, 8 TB/s
  s.nvlink_bandwidth = 900 * G;  // NVLink 5: 1.8 TB/s bidirectional
  s.network_bandwidth = 50 * G;  // ConnectX-7 400 Gb/s per GPU
  // HGX B200: PCIe Gen5 x16 to the host; GB200: NVLink-C2C to the Grace CPU (900 GB/s both ways, 450 one way).
  s.host_bandwidth = 0.82 * (domain > 8 ? 450 : 64) * G;  // Hopper's measured share (above)
  s.gpus_per_nvlink_domain = domain;
  s.gemm_bf16_efficiency = 0.776;  // MAMF 1745 of 2250 TFLOPS on B200 (ml-engineering)
  s.gemm_fp8_efficiency = 0.763;   // MAMF 3432.5 of 4500 TFLOPS on B200 (ml-engineering)
  s.gemm_k_overhead = 216;         // fitted to XLA's sm_100 (B200) BF16 GEMM table (docs/plan.md)
  s.gemm_fixed_seconds = 6.3e-6;
  s.grouped_gemm_fixed_share = 0.6;   // Hopper's (no published Blackwell figure for TransformerEngine's)
  s.attention_fwd_efficiency = 0.60;  // FlashAttention-4 / cuDNN on Blackwell: taken as FA3's Hopper fractions
  s.attention_bwd_efficiency = 0.45;
  s.hbm_efficiency = 0.85;
  s.nccl_busbw_nvlink = 720 * G;  // NVLink 5: twice NVLink 4's measured bus bandwidth
  s.nccl_busbw_network = 45 * G;
  s.alltoall_busbw_network = 35 * G;
  s.kernel_launch_seconds = 4e-6;
  s.collective_latency_nvlink = 6e-6;  // taken as Hopper's (no public Blackwell figure read)
  s.collective_latency_network = 25e-6;
  s.sms = 148, s.comm_sms = 32;  // B200: 148 SMs
  return s;
}

const std::vector<GpuSpec>& table() {
  static const std::vector<GpuSpec> t = {
      hopper("h100", "H100 SXM5 80 GB (DGX/HGX H100: 8 per NVLink domain)", 80, 3.35),
      hopper("h200", "H200 SXM 141 GB (HGX H200: 8 per NVLink domain)", 141, 4.8),
      blackwell("b200", "B200 180 GB (DGX/HGX B200: 8 per NVLink domain)", 2250, 180, 8),
      blackwell("gb200", "GB200 NVL72 (72 per NVLink domain)", 2500, 186, 72),
  };
  return t;
}

}  // namespace

std::vector<std::string> gpu_names() {
  std::vector<std::string> out;
  for (const GpuSpec& s : table()) out.push_back(s.name);
  return out;
}

const GpuSpec& gpu_spec(const std::string& name) {
  for (const GpuSpec& s : table())
    if (s.name == name) return s;
  MOE_CHECK(false, "moecore plan: --plan-gpu {} is not a GPU the planner knows; use one of {}", name,
            fmt::join(gpu_names(), ", "));
  throw Error("unreachable");
}

}  // namespace moecore::train::plan
