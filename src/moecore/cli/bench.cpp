// Benchmarks (see bench.h).
#include "moecore/cli/bench.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "moecore/core/cpu.h"
#include "moecore/core/rng.h"
#include "moecore/core/tensor.h"
#include "moecore/kernels/cpu/attention.h"
#include "moecore/kernels/cpu/gemm.h"

namespace moecore::cli {

namespace {
double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void fill_random(Tensor& t, uint64_t stream, double std) {
  Philox rng(1234, stream);
  for (int64_t i = 0; i < t.numel(); i++) t.set_item(i, std * rng.normal(static_cast<uint64_t>(i)));
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
}  // namespace

GemmBenchResult bench_gemm(DType dtype, int64_t n, int iters) {
  Tensor a = Tensor::empty({n, n}, DType::F32), b = Tensor::empty({n, n}, DType::F32);
  fill_random(a, 1, 1.0);
  fill_random(b, 2, 1.0);
  Tensor A = a.to(dtype), B = b.to(dtype);
  Tensor C = Tensor::empty({n, n}, DType::F32);
  kernels::gemm(A, false, B, false, C);  // warm-up: creates the primitive
  std::vector<double> rates;
  for (int i = 0; i < iters; i++) {
    const double t0 = now_s();
    kernels::gemm(A, false, B, false, C);
    const double dt = now_s() - t0;
    rates.push_back(2.0 * n * n * n / dt / 1e9);
  }
  return {*std::max_element(rates.begin(), rates.end()), median(rates)};
}

void run_bench_gemm(int64_t size, int iters) {
  fmt::print("moecore bench gemm: M=N=K={}, {} timed runs, {} threads\n", size, iters, num_threads());
  const GemmBenchResult f = bench_gemm(DType::F32, size, iters);
  fmt::print("  f32  GEMM: {:8.1f} GFLOP/s best, {:8.1f} median\n", f.gflops_best, f.gflops_median);
  const GemmBenchResult h = bench_gemm(DType::BF16, size, iters);
  fmt::print("  bf16 GEMM: {:8.1f} GFLOP/s best, {:8.1f} median  ({:.2f}x f32{})\n", h.gflops_best,
             h.gflops_median, h.gflops_best / f.gflops_best,
             kernels::gemm_stats().bf16_native ? "" : "; no native bf16 on this CPU, widened to f32");
}

void run_bench_attention(const AttentionBenchArgs& a) {
  fmt::print("moecore bench attention: S={} B={} heads={} kv_heads={} head_dim={} causal, {} timed runs, {} threads\n",
             a.seq, a.batch, a.heads, a.kv_heads, a.head_dim, a.iters, num_threads());
  const GemmBenchResult peak = bench_gemm(DType::F32, a.gemm_size, 3);
  Tensor q = Tensor::empty({a.seq, a.batch, a.heads, a.head_dim}, DType::F32);
  Tensor k = Tensor::empty({a.seq, a.batch, a.kv_heads, a.head_dim}, DType::F32);
  Tensor v = Tensor::empty(k.shape(), DType::F32);
  Tensor dout = Tensor::empty(q.shape(), DType::F32);
  fill_random(q, 3, 1.0);
  fill_random(k, 4, 1.0);
  fill_random(v, 5, 1.0);
  fill_random(dout, 6, 1.0);
  Tensor o = Tensor::empty(q.shape(), DType::F32), lse = Tensor::empty({a.batch, a.heads, a.seq}, DType::F32);
  Tensor dq = Tensor::empty(q.shape(), DType::F32), dk = Tensor::empty(k.shape(), DType::F32),
         dv = Tensor::empty(v.shape(), DType::F32);
  const double scale = 1.0 / std::sqrt(static_cast<double>(a.head_dim));
  // FLOPs as FlashAttention counts them: forward 4·S²·D per head (QKᵀ and PV), halved by the causal mask;
  // backward 2.5× forward.
  const double fwd_flops = 4.0 * a.seq * a.seq * a.head_dim * a.heads * a.batch / 2.0;
  std::vector<double> fwd_rates, total_rates;
  for (int i = 0; i <= a.iters; i++) {
    const double t0 = now_s();
    kernels::attention_forward(q, k, v, scale, o, lse);
    const double t1 = now_s();
    kernels::attention_backward(dout, q, k, v, o, lse, scale, dq, dk, dv);
    const double t2 = now_s();
    if (i == 0) continue;  // warm-up
    fwd_rates.push_back(fwd_flops / (t1 - t0) / 1e9);
    total_rates.push_back(3.5 * fwd_flops / (t2 - t0) / 1e9);
  }
  const double fwd = median(fwd_rates), tot = median(total_rates);
  fmt::print("  f32 GEMM peak (M=N=K={}): {:.1f} GFLOP/s\n", a.gemm_size, peak.gflops_best);
  fmt::print("  attention forward:          {:8.1f} GFLOP/s  ({:.1f}% of GEMM peak)\n", fwd,
             100.0 * fwd / peak.gflops_best);
  fmt::print("  attention forward+backward: {:8.1f} GFLOP/s  ({:.1f}% of GEMM peak)\n", tot,
             100.0 * tot / peak.gflops_best);
}

}  // namespace moecore::cli
