// GPU benchmarks (see gpu.h). Operands are filled on the host and copied once; every timed run ends with a
// synchronisation, so the host clock measures the GPU's work.
#include "moecore/cli/bench/gpu.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "moecore/cli/bench/bench_util.h"
#include "moecore/core/rng.h"
#include "moecore/core/timer.h"
#include "moecore/device/runtime.h"
#include "moecore/kernels/attention.h"
#include "moecore/kernels/attention_backend.h"
#include "moecore/kernels/gemm.h"

namespace moecore::cli {

namespace {
Tensor random_on(Device d, const Shape& s, DType dtype, uint64_t stream) {
  Tensor h = Tensor::empty(s, DType::F32);
  fill_random(h, stream, 1.0);
  return h.to(dtype).to(d);
}

}  // namespace

double gpu_bf16_peak_gflops(Device d) {
  return kernels::measure_gemm_peak_gflops(DType::BF16, d);
}

void run_bench_gemm_gpu(Device d, int64_t size, int iters) {
  fmt::print("moecore bench gemm --device {}: M=N=K={}, {} timed runs\n  device: {}\n", d.str(), size, iters,
             device::describe_device(d));
  const auto [f_best, f_median] = kernels::time_square_gemm(DType::F32, size, iters, d);
  fmt::print("  f32  GEMM: {:8.1f} GFLOP/s best, {:8.1f} median (cuBLASLt, TF32 off)\n", f_best, f_median);
  const auto [h_best, h_median] = kernels::time_square_gemm(DType::BF16, size, iters, d);
  fmt::print("  bf16 GEMM: {:8.1f} GFLOP/s best, {:8.1f} median  ({:.2f}x f32)\n", h_best, h_median, h_best / f_best);
  fmt::print("  cuBLAS bf16 peak: {:.1f} GFLOP/s (best of M=N=K=4096 and 8192, this run)\n", gpu_bf16_peak_gflops(d));
}

void run_bench_attention_gpu(Device d, int64_t seq, int64_t batch, int64_t heads, int64_t kv_heads, int64_t head_dim,
                             int iters, bool bf16, double dropout) {
  // bf16: cuDNN's fused attention and the native kernels, run by run (cuDNN only where it loads on this GPU).
  using kernels::AttentionBackend;
  const AttentionBackend chosen = kernels::attention_backend();
  std::string cudnn_why;
  const bool with_cudnn = bf16 && kernels::cudnn_attention_available(&cudnn_why);
  const bool compare = with_cudnn && chosen != AttentionBackend::kNative;
  fmt::print(
      "moecore bench attention --device {}: S={} B={} heads={} kv_heads={} head_dim={} causal, {} ({}), {} "
      "timed runs{}\n  device: {}\n",
      d.str(), seq, batch, heads, kv_heads, head_dim, bf16 ? "bf16" : "f32",
      !bf16        ? "own flash kernel"
      : compare    ? fmt::format("cuDNN {} fused attention against the native tensor-core kernels, run by run",
                                 kernels::cudnn_version_str(kernels::cudnn_loaded_version()))
      : with_cudnn ? std::string("native tensor-core kernels (attention backend native)")
                   : fmt::format("native tensor-core kernels; cuDNN unavailable: {}", cudnn_why),
      iters, dropout > 0 ? fmt::format("; attention dropout {} timed against none, run by run", dropout) : "",
      device::describe_device(d));
  const Tensor q = random_on(d, {seq, batch, heads, head_dim}, DType::F32, 3);
  const Tensor k = random_on(d, {seq, batch, kv_heads, head_dim}, DType::F32, 4);
  const Tensor v = random_on(d, k.shape(), DType::F32, 5), dout = random_on(d, q.shape(), DType::F32, 6);
  Tensor o = Tensor::empty(q.shape(), DType::F32, d), lse = Tensor::empty({batch, heads, seq}, DType::F32, d);
  Tensor dq = Tensor::empty(q.shape(), DType::F32, d), dk = Tensor::empty(k.shape(), DType::F32, d),
         dv = Tensor::empty(v.shape(), DType::F32, d);
  const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
  const double fwd_flops = 4.0 * seq * seq * head_dim * heads * batch / 2.0;  // causal: half of 4·S²·D per head
  // Attention dropout as training applies it (Megatron's --attention-dropout; one sample index per sequence).
  std::vector<int64_t> samples(static_cast<size_t>(batch));
  for (int64_t b = 0; b < batch; b++) samples[static_cast<size_t>(b)] = b;
  kernels::AttentionDropout drop;
  drop.mask = kernels::DropoutMask::make(1234, stream_id("bench attention"), dropout);
  drop.sample_B = samples.data();
  // Forward and forward+backward seconds of one run, with or without dropout.
  auto run = [&](const kernels::AttentionDropout* dr) {
    Stopwatch t;
    if (bf16)
      kernels::attention_forward_bf16(q, k, v, scale, o, lse, dr);
    else
      kernels::attention_forward(q, k, v, scale, o, lse, dr);
    device::synchronize();
    const double tf = t.seconds();
    if (bf16)
      kernels::attention_backward_bf16(dout, q, k, v, o, lse, scale, dq, dk, dv, dr);
    else
      kernels::attention_backward(dout, q, k, v, o, lse, scale, dq, dk, dv, dr);
    device::synchronize();
    return std::pair{tf, t.seconds()};
  };
  // The same run on one backend (the chosen one restored after).
  auto run_on = [&](AttentionBackend b) {
    kernels::set_attention_backend(b);
    const auto r = run(nullptr);
    kernels::set_attention_backend(chosen);
    return r;
  };
  // With dropout, the runs alternate (none, dropout) so both see the same clocks and temperature; with cuDNN, the
  // native kernels' run alternates with cuDNN's.
  std::vector<double> f_rates, t_rates, fd_rates, td_rates, ratios, nf_rates, nt_rates, speedups;
  const int64_t cudnn_calls_before = kernels::cudnn_attention_calls().backward;
  for (int i = 0; i <= iters; i++) {
    const auto [tf, tt] = run(nullptr);
    const auto [tfd, ttd] = dropout > 0 ? run(&drop) : std::pair{0.0, 0.0};
    const auto [ntf, ntt] = compare ? run_on(AttentionBackend::kNative) : std::pair{0.0, 0.0};
    if (i == 0) continue;  // warm-up
    f_rates.push_back(fwd_flops / tf / 1e9);
    t_rates.push_back(3.5 * fwd_flops / tt / 1e9);
    if (compare) {
      nf_rates.push_back(fwd_flops / ntf / 1e9);
      nt_rates.push_back(3.5 * fwd_flops / ntt / 1e9);
      speedups.push_back(ntt / tt);
    }
    if (dropout <= 0) continue;
    fd_rates.push_back(fwd_flops / tfd / 1e9);
    td_rates.push_back(3.5 * fwd_flops / ttd / 1e9);
    ratios.push_back(ttd / tt);
  }
  const double peak = gpu_bf16_peak_gflops(d), f = median(f_rates), tot = median(t_rates);
  // The chosen backend's calls ran cuDNN only if it took them (a refused shape falls back, and says why above).
  const bool cudnn_ran = compare && kernels::cudnn_attention_calls().backward > cudnn_calls_before;
  const char* who = !bf16 ? "" : cudnn_ran ? " [cuDNN]" : " [native]";
  fmt::print("  attention forward{}:          {:10.1f} GFLOP/s ({:.3f} of the cuBLAS bf16 peak)\n", who, f, f / peak);
  fmt::print("  attention forward+backward{}: {:10.1f} GFLOP/s ({:.3f} of the cuBLAS bf16 peak)\n", who, tot,
             tot / peak);
  if (compare) {
    const double nf = median(nf_rates), nt = median(nt_rates), sp = median(speedups);
    fmt::print("  native kernels forward:          {:10.1f} GFLOP/s ({:.3f} of the cuBLAS bf16 peak)\n", nf, nf / peak);
    fmt::print("  native kernels forward+backward: {:10.1f} GFLOP/s ({:.3f} of the cuBLAS bf16 peak)\n", nt, nt / peak);
    fmt::print(
        "attention_backends device=cuda dtype=bf16 S={} B={} heads={}/{} D={} cudnn_ran={} cudnn_fwd_tflops={:.1f} "
        "cudnn_fwd_bwd_tflops={:.1f} native_fwd_tflops={:.1f} native_fwd_bwd_tflops={:.1f} speedup={:.3f} "
        "peak_tflops={:.1f}\n",
        seq, batch, heads, kv_heads, head_dim, cudnn_ran ? 1 : 0, f / 1e3, tot / 1e3, nf / 1e3, nt / 1e3, sp,
        peak / 1e3);
  }
  if (dropout > 0) {
    const double fd = median(fd_rates), td = median(td_rates), ratio = median(ratios);
    fmt::print("  with dropout {}: forward    {:10.1f} GFLOP/s ({:.3f} of the cuBLAS bf16 peak)\n", dropout, fd,
               fd / peak);
    fmt::print("  with dropout {}: fwd+bwd    {:10.1f} GFLOP/s ({:.3f} of the cuBLAS bf16 peak)\n", dropout, td,
               td / peak);
    fmt::print("  dropout {} costs {:.3f}x the time of attention fwd+bwd without it (median of the paired runs)\n",
               dropout, ratio);
    fmt::print(
        "attention_dropout device=cuda dtype={} p={} fwd_gflops={:.1f} fwd_bwd_gflops={:.1f} "
        "fwd_gflops_dropout={:.1f} fwd_bwd_gflops_dropout={:.1f} time_ratio={:.3f}\n",
        bf16 ? "bf16" : "f32", dropout, f, tot, fd, td, ratio);
  }
  fmt::print("  cuBLAS bf16 peak: {:.1f} GFLOP/s (this run)\n", peak);
}

}  // namespace moecore::cli
