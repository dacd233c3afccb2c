// `moecore bench gemm`: f32 and bf16 square GEMM GFLOP/s, the roofline the other benchmarks divide by.
// Not the peak other benchmarks use (kernels::measure_gemm_peak_gflops takes the best over sizes).
#include "moecore/kernels/gemm.h"

#include <fmt/format.h>

#include "moecore/cli/bench/benches.h"
#include "moecore/cli/bench/gpu.h"
#include "moecore/core/cpu.h"
#include "moecore/device/device_select.h"

namespace moecore::cli {

namespace {
struct GemmBenchArgs {
  int64_t size = 2048;
  int iters = 10;
  std::string device = "auto";
};

// Square GEMMs M=N=K=size, f32 then bf16, `iters` timed runs after one warm-up.
void run_bench_gemm(const GemmBenchArgs& a) {
  const Device d = device::resolve_device(a.device, "bench gemm");
  if (d.is_cuda()) return run_bench_gemm_gpu(d, a.size, a.iters);
  fmt::print("moecore bench gemm: M=N=K={}, {} timed runs, {} threads\n", a.size, a.iters, num_threads());
  const auto [f_best, f_median] = kernels::time_square_gemm(DType::F32, a.size, a.iters);
  fmt::print("  f32  GEMM: {:8.1f} GFLOP/s best, {:8.1f} median\n", f_best, f_median);
  const auto [h_best, h_median] = kernels::time_square_gemm(DType::BF16, a.size, a.iters);
  fmt::print("  bf16 GEMM: {:8.1f} GFLOP/s best, {:8.1f} median  ({:.2f}x f32{})\n", h_best, h_median, h_best / f_best,
             kernels::gemm_stats().bf16_native ? "" : "; no native bf16 on this CPU, widened to f32");
}
}  // namespace

BenchCommand add_gemm_bench(CLI::App& bench) {
  auto a = std::make_shared<GemmBenchArgs>();
  CLI::App* cmd = bench.add_subcommand("gemm", "f32 and bf16 GEMM GFLOP/s (the roofline other benchmarks use)");
  cmd->add_option("--size", a->size, "M = N = K")->check(CLI::Range(int64_t{1}, int64_t{65536}))->capture_default_str();
  cmd->add_option("--iters", a->iters, "Timed runs")->check(CLI::Range(1, 100000))->capture_default_str();
  cmd->add_option("--device", a->device, "auto (the GPU when one is visible), cpu or cuda[:N]")->capture_default_str();
  return {cmd, [a] { run_bench_gemm(*a); }};
}

}  // namespace moecore::cli
