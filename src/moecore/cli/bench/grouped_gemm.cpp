// `moecore bench grouped-gemm --device cuda`: the six expert GEMMs of one MoE layer's forward and backward (fc1 and
// fc2: forward, data gradient, weight gradient) over balanced expert row counts, bf16 operands with f32 accumulation,
// bf16 outputs and f32 weight gradients as the GPU experts run them under --bf16 (one cuBLASLt matmul per expert,
// kernels/grouped_gemm.h), as TFLOP/s and as a fraction of the cuBLAS bf16 peak measured in the same run. Shapes:
// Qwen3-30B-A3B's experts (H=2048, F=768, E=128, top-8) and Mixtral 8x7B's (H=4096, F=14336, E=8, top-2), 16,384 tokens
// by default.
#include "moecore/kernels/grouped_gemm.h"

#include <fmt/format.h>

#include <algorithm>
#include <vector>

#include "moecore/cli/bench/bench_util.h"
#include "moecore/cli/bench/benches.h"
#include "moecore/cli/bench/gpu.h"
#include "moecore/core/timer.h"
#include "moecore/device/device_select.h"
#include "moecore/device/runtime.h"

namespace moecore::cli {

namespace {
struct GroupedGemmBenchArgs {
  int64_t tokens = 16384;
  int iters = 10;
  std::string device = "cuda";
  std::string model = "all";
};

struct ExpertShape {
  const char* name;
  int64_t H, F, E, K;
};

// A GPU tensor of `dtype` filled with a tiled host-random pattern (one 1M-element chunk drawn on the host, so the
// large expert weights need no host-sized buffers).
Tensor random_gpu(Device d, const Shape& s, DType dtype, uint64_t seed) {
  Tensor t = Tensor::empty(s, dtype, d);
  const int64_t n = t.numel(), chunk = std::min<int64_t>(n, int64_t{1} << 20);
  if (n == 0) return t;
  Tensor h = Tensor::empty({chunk}, DType::F32);
  fill_random(h, seed, 0.05);
  const Tensor c = h.to(d);
  Tensor flat = t.reshape({n});
  for (int64_t o = 0; o < n; o += chunk) {
    const int64_t m = std::min(chunk, n - o);
    Tensor part = flat.slice(o, m);
    part.copy_from(c.slice(0, m));
  }
  return t;
}

void bench_shape(Device d, const ExpertShape& s, int64_t tokens, int iters, double peak) {
  const int64_t R = tokens * s.K, F1 = 2 * s.F;
  const std::vector<int64_t> rows(static_cast<size_t>(s.E), R / s.E);
  std::vector<int64_t> begin(static_cast<size_t>(s.E));
  for (int64_t e = 0; e < s.E; e++) begin[static_cast<size_t>(e)] = e * (R / s.E);
  const int64_t Rb = R / s.E * s.E;  // balanced: every expert the same rows
  fmt::print("  {}: H={} F={} E={} top-{}, {} tokens -> {} rows per expert\n", s.name, s.H, s.F, s.E, s.K, tokens,
             R / s.E);
  const Tensor x = random_gpu(d, {Rb, s.H}, DType::BF16, 1), dy = random_gpu(d, {Rb, s.H}, DType::BF16, 2);
  const Tensor w1 = random_gpu(d, {s.E, F1, s.H}, DType::BF16, 3), w2 = random_gpu(d, {s.E, s.H, s.F}, DType::BF16, 4);
  const Tensor a = random_gpu(d, {Rb, s.F}, DType::BF16, 5), dh = random_gpu(d, {Rb, F1}, DType::BF16, 6);
  Tensor h = Tensor::empty({Rb, F1}, DType::BF16, d), y = Tensor::empty({Rb, s.H}, DType::BF16, d);
  Tensor da = Tensor::empty({Rb, s.F}, DType::BF16, d), dx = Tensor::empty({Rb, s.H}, DType::BF16, d);
  Tensor dw1 = Tensor::zeros({s.E, F1, s.H}, DType::F32, d), dw2 = Tensor::zeros({s.E, s.H, s.F}, DType::F32, d);
  const double fwd_flops = 2.0 * static_cast<double>(Rb) * (F1 * s.H + s.H * s.F), all_flops = 3 * fwd_flops;
  auto forward = [&] {
    kernels::grouped_gemm(x, w1, true, h, begin, rows);
    kernels::grouped_gemm(a, w2, true, y, begin, rows);
  };
  auto backward = [&] {
    kernels::grouped_gemm(dy, w2, false, da, begin, rows);
    kernels::grouped_gemm_wgrad(dy, a, dw2, begin, rows);
    kernels::grouped_gemm(dh, w1, false, dx, begin, rows);
    kernels::grouped_gemm_wgrad(dh, x, dw1, begin, rows);
  };
  forward(), backward();  // warm-up: plans, handles, workspaces
  device::synchronize();
  std::vector<double> f_rates, t_rates;
  for (int i = 0; i < iters; i++) {
    const Stopwatch t0;
    forward();
    device::synchronize();
    const double tf = t0.seconds();
    const Stopwatch t1;
    forward(), backward();
    device::synchronize();
    f_rates.push_back(fwd_flops / tf / 1e12);
    t_rates.push_back(all_flops / t1.seconds() / 1e12);
  }
  const double f = median(f_rates), tot = median(t_rates);
  fmt::print("    forward {:7.1f} TFLOP/s ({:.3f} of peak), forward+backward {:7.1f} TFLOP/s ({:.3f} of peak)\n", f,
             f * 1e3 / peak, tot, tot * 1e3 / peak);
}

void run_bench_grouped_gemm(const GroupedGemmBenchArgs& a) {
  const Device d = device::resolve_device(a.device, "bench grouped-gemm");
  MOE_CHECK(d.is_cuda(),
            "bench grouped-gemm runs on the GPU only (--device cuda); the CPU experts are measured by "
            "bench moe-layer");
  fmt::print(
      "moecore bench grouped-gemm --device {}: expert GEMMs of one MoE layer (fc1, fc2: forward, dgrad, wgrad), "
      "bf16 operands, bf16 outputs, f32 weight gradients, median of {} runs\n  device: {}\n",
      d.str(), a.iters, device::describe_device(d));
  const double peak = gpu_bf16_peak_gflops(d);
  const ExpertShape shapes[] = {{"qwen3-30b-a3b", 2048, 768, 128, 8}, {"mixtral-8x7b", 4096, 14336, 8, 2}};
  for (const ExpertShape& s : shapes)
    if (a.model == "all" || a.model == s.name) bench_shape(d, s, a.tokens, a.iters, peak);
  fmt::print("  cuBLAS bf16 peak: {:.1f} GFLOP/s (best of M=N=K=4096 and 8192, this run)\n", peak);
}
}  // namespace

BenchCommand add_grouped_gemm_bench(CLI::App& bench) {
  auto a = std::make_shared<GroupedGemmBenchArgs>();
  CLI::App* cmd =
      bench.add_subcommand("grouped-gemm", "Grouped expert GEMM TFLOP/s on the GPU against the cuBLAS peak");
  cmd->add_option("--tokens", a->tokens, "Tokens routed (top-k rows each, balanced over the experts)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 22))
      ->capture_default_str();
  cmd->add_option("--iters", a->iters, "Timed runs")->check(CLI::Range(1, 100000))->capture_default_str();
  cmd->add_option("--model", a->model, "all, qwen3-30b-a3b or mixtral-8x7b")
      ->check(CLI::IsMember({"all", "qwen3-30b-a3b", "mixtral-8x7b"}))
      ->capture_default_str();
  cmd->add_option("--device", a->device, "cuda[:N] (the GPU is required)")->capture_default_str();
  return {cmd, [a] { run_bench_grouped_gemm(*a); }};
}

}  // namespace moecore::cli
