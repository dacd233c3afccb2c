// `moecore bench attention`: causal GQA attention forward and forward+backward GFLOP/s against a GEMM peak of the
// same dtype sampled between the timed runs, f32 (flash kernel) or bf16 (the kernel --bf16 training picks, or the one
// --bf16-kernel names). Not the attention module (no projections).
#include "moecore/kernels/attention.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "moecore/cli/bench/bench_util.h"
#include "moecore/cli/bench/benches.h"
#include "moecore/cli/bench/gpu.h"
#include "moecore/core/cpu.h"
#include "moecore/core/rng.h"
#include "moecore/core/timer.h"
#include "moecore/device/device_select.h"
#include "moecore/kernels/attention_backend.h"
#include "moecore/kernels/attention_named.h"
#include "moecore/kernels/rope.h"

namespace moecore::cli {

namespace {
struct AttentionBenchArgs {
  int64_t seq = 2048, batch = 1, heads = 8, kv_heads = 2, head_dim = 64;
  int iters = 3;
  std::string dtype = "f32";
  std::string bf16_kernel = "auto";
  std::string device = "auto";
  bool bf16_tensors = false;
  int64_t block_q0 = -1;  // ≥ 0: a context-parallel block, queries at q0.., keys at 0..
  double dropout = 0;     // attention dropout, as --attention-dropout trains it (Megatron's default 0.1)
  std::string backend;    // the GPU bf16 attention's backend (kernels/attention_backend.h); empty: as configured
};

void run_bench_attention(const AttentionBenchArgs& a) {
  MOE_CHECK(a.heads % a.kv_heads == 0, "--num-attention-heads ({}) must be a multiple of --num-query-groups ({})",
            a.heads, a.kv_heads);
  const Device d = device::resolve_device(a.device, "bench attention");
  if (d.is_cuda()) {
    MOE_CHECK(a.bf16_kernel == "auto", "--bf16-kernel {} names a CPU kernel; on the GPU use --attention-backend",
              a.bf16_kernel);
    if (!a.backend.empty()) kernels::set_attention_backend(kernels::parse_attention_backend(a.backend));
    return run_bench_attention_gpu(d, a.seq, a.batch, a.heads, a.kv_heads, a.head_dim, a.iters, a.dtype == "bf16",
                                   a.dropout);
  }
  const bool bf16 = a.dtype == "bf16";
  MOE_CHECK(!bf16 || a.seq <= kernels::kMaxBf16AttentionSeq, "bf16 attention runs up to --seq-length {}, got {}",
            kernels::kMaxBf16AttentionSeq, a.seq);
  MOE_CHECK(bf16 || a.bf16_kernel == "auto", "--bf16-kernel {} applies to --dtype bf16 only", a.bf16_kernel);
  // The kernel that runs: the one training picks (auto) or the one named; native picks AMX over AVX512-BF16.
  using kernels::Bf16AttentionKernel;
  Bf16AttentionKernel kind = kernels::bf16_attention_kernel();
  if (a.bf16_kernel == "onednn") kind = Bf16AttentionKernel::OneDnn;
  if (a.bf16_kernel == "flash") kind = Bf16AttentionKernel::Flash;
  if (a.bf16_kernel == "native") {
    MOE_CHECK(kernels::has_native_bf16_attention(),
              "--bf16-kernel native needs AVX512-BF16 or AMX, which this CPU lacks; use flash or onednn");
    kind = Bf16AttentionKernel::FlashNative;
  }
  const bool block = a.block_q0 >= 0;
  MOE_CHECK(!block || (a.bf16_kernel != "onednn" && !a.bf16_tensors),
            "--block-q0 times the context-parallel block kernels: flash or native, f32 tensors");
  // The blocks have a native and a flash form only: where training would pick oneDNN, CP runs the flash blocks.
  if (block && kind == Bf16AttentionKernel::OneDnn) kind = Bf16AttentionKernel::Flash;
  const bool onednn = kind == Bf16AttentionKernel::OneDnn, native = kind == Bf16AttentionKernel::FlashNative;
  MOE_CHECK(!a.bf16_tensors || (bf16 && native),
            "--bf16-tensors needs --dtype bf16 and the native kernel (a CPU with AVX512-BF16 or AMX)");
  const std::string kernel =
      !bf16    ? "flash f32"
      : onednn ? "oneDNN bf16 batched matmuls"
      : native ? fmt::format("flash, native bf16 block products ({})", kernels::native_bf16_attention_name())
               : "flash, bf16 operands";
  const std::string tag = !bf16 ? "flash" : onednn ? "onednn" : native ? "native" : "flash";
  fmt::print(
      "moecore bench attention: S={} B={} heads={} kv_heads={} head_dim={} causal, {} ({}), {} timed runs, {} "
      "threads{}{}\n",
      a.seq, a.batch, a.heads, a.kv_heads, a.head_dim, a.dtype, kernel, a.iters, num_threads(),
      a.bf16_tensors ? "; bf16 tensors and RoPE inside the kernel, as --bf16 training runs it" : "",
      a.dropout > 0 ? fmt::format("; attention dropout {}", a.dropout) : "");
  // --bf16-tensors: q, k, v, dout, o, dq, dk, dv in bf16 (lse f32) and RoPE applied by the kernel.
  const DType io = a.bf16_tensors ? DType::BF16 : DType::F32;
  auto random = [&](const Shape& shape, uint64_t seed) {
    Tensor t = Tensor::empty(shape, DType::F32);
    fill_random(t, seed, 1.0);
    return t.as_dtype(io);
  };
  const Tensor q = random({a.seq, a.batch, a.heads, a.head_dim}, 3),
               k = random({a.seq, a.batch, a.kv_heads, a.head_dim}, 4);
  const Tensor v = random(k.shape(), 5), dout = random(q.shape(), 6);
  Tensor o = Tensor::empty(q.shape(), io), lse = Tensor::empty({a.batch, a.heads, a.seq}, DType::F32);
  // dq starts at zero: the block kernels add into it.
  Tensor dq = Tensor::zeros(q.shape(), io), dk = Tensor::empty(k.shape(), io), dv = Tensor::empty(v.shape(), io);
  Tensor cos, sin;
  kernels::rope_tables(a.seq, a.head_dim / 2 * 2, 10000.0, DType::F32, cos, sin);
  const kernels::AttentionRope rope_tables{&cos, &sin, a.head_dim / 2 * 2};
  const kernels::AttentionRope* rope = a.bf16_tensors ? &rope_tables : nullptr;
  const double scale = 1.0 / std::sqrt(static_cast<double>(a.head_dim));
  std::vector<int64_t> samples(static_cast<size_t>(a.batch));
  for (int64_t b = 0; b < a.batch; b++) samples[static_cast<size_t>(b)] = b;
  kernels::AttentionDropout dropout;
  dropout.mask = kernels::DropoutMask::make(1234, stream_id("bench attention"), a.dropout);
  dropout.sample_B = samples.data();
  const kernels::AttentionDropout* drop = a.dropout > 0 ? &dropout : nullptr;
  // FLOPs as FlashAttention counts them: forward 4·D per visible (query, key) pair and head (QKᵀ and PV): S²/2
  // under the causal mask, or a block's visible pairs; backward 2.5× forward.
  double pairs = static_cast<double>(a.seq) * static_cast<double>(a.seq) / 2.0;
  if (block) {
    pairs = 0;
    for (int64_t i = 0; i < a.seq; i++) pairs += static_cast<double>(std::clamp<int64_t>(a.block_q0 + i + 1, 0, a.seq));
  }
  const double fwd_flops = 4.0 * pairs * static_cast<double>(a.head_dim * a.heads * a.batch);
  std::vector<double> fwd_rates, total_rates;
  PeakSampler peak(bf16 ? DType::BF16 : DType::F32);
  for (int i = 0; i <= a.iters; i++) {
    if (i > 0) peak.sample();  // interleaved with the timed runs (after the warm-up)
    const Stopwatch timer;
    if (!bf16 && block)
      kernels::attention_block_forward(q, k, v, a.block_q0, 0, scale, o, lse, drop);
    else if (!bf16)
      kernels::attention_forward(q, k, v, scale, o, lse, drop);
    else
      kernels::attention_forward_named(kind, q, k, v, block ? a.block_q0 : -1, scale, o, lse, drop, rope);
    const double fwd_s = timer.seconds();
    if (!bf16 && block)
      kernels::attention_block_backward(dout, q, k, v, o, lse, a.block_q0, 0, scale, dq, dk, dv, drop);
    else if (!bf16)
      kernels::attention_backward(dout, q, k, v, o, lse, scale, dq, dk, dv, drop);
    else
      kernels::attention_backward_named(kind, dout, q, k, v, o, lse, block ? a.block_q0 : -1, scale, dq, dk, dv, drop,
                                        rope);
    const double total_s = timer.seconds();
    if (i == 0) continue;  // warm-up
    fwd_rates.push_back(fwd_flops / fwd_s / 1e9);
    total_rates.push_back(3.5 * fwd_flops / total_s / 1e9);
  }
  peak.sample();
  const double fwd = median(fwd_rates), tot = median(total_rates), p = peak.median();
  fmt::print("  {}\n", peak.describe());
  fmt::print("  attention forward:          {:8.1f} GFLOP/s  ({:.1f}% of GEMM peak)\n", fwd, 100.0 * fwd / p);
  fmt::print("  attention forward+backward: {:8.1f} GFLOP/s  ({:.1f}% of GEMM peak)\n", tot, 100.0 * tot / p);
  fmt::print("  {}\n", describe_paired(total_rates, peak.samples()));
  fmt::print(
      "attention dtype={} kernel={}{}{}{} fwd_gflops={:.1f} fwd_bwd_gflops={:.1f} peak_gflops={:.1f} ratio={:.3f} "
      "paired_ratio={:.3f}\n",
      a.dtype, tag, a.bf16_tensors ? " tensors=bf16" : "", block ? fmt::format(" block_q0={}", a.block_q0) : "",
      a.dropout > 0 ? fmt::format(" dropout={}", a.dropout) : "", fwd, tot, p, tot / p,
      paired_peak_ratio(total_rates, peak.samples()));
}
}  // namespace

BenchCommand add_attention_bench(CLI::App& bench) {
  auto a = std::make_shared<AttentionBenchArgs>();
  CLI::App* cmd = bench.add_subcommand("attention", "Causal GQA attention forward+backward GFLOP/s vs GEMM peak");
  cmd->add_option("--seq-length", a->seq, "S")->check(CLI::Range(int64_t{1}, int64_t{1} << 20))->capture_default_str();
  cmd->add_option("--micro-batch-size", a->batch, "B")->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_option("--num-attention-heads", a->heads, "query heads")->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_option("--num-query-groups", a->kv_heads, "kv heads")->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_option("--kv-channels", a->head_dim, "head dim")->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_option("--iters", a->iters, "Timed runs")->check(CLI::Range(1, 1000))->capture_default_str();
  cmd->add_option("--dtype", a->dtype, "f32 (flash kernel) or bf16 (bf16 operands, as --bf16 trains)")
      ->check(CLI::IsMember({"f32", "bf16"}))
      ->capture_default_str();
  cmd->add_option(
         "--bf16-kernel", a->bf16_kernel,
         "bf16 kernel: auto (as training picks: native where the CPU has AVX512-BF16 or AMX, else oneDNN where its "
         "bf16 "
         "matmul is native, else flash), native (flash with AVX512-BF16 or AMX block products), flash (f32 block "
         "products on bf16-rounded operands), onednn")
      ->check(CLI::IsMember({"auto", "native", "flash", "onednn"}))
      ->capture_default_str();
  cmd->add_flag("--bf16-tensors", a->bf16_tensors,
                "bf16 q, k, v, dout, o and gradients with RoPE applied by the kernel, as --bf16 training runs the "
                "native kernel (default: f32 tensors, the kernel alone)");
  cmd->add_option("--block-q0", a->block_q0,
                  "time one context-parallel attention block instead: S queries at positions q0.. against S keys at "
                  "0.. (q0 = S: wholly visible; 0: the diagonal), as CP's p2p ring runs them")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 30));
  cmd->add_option("--attention-dropout", a->dropout,
                  "attention dropout probability, as training applies it inside the kernel (Megatron's default 0.1; "
                  "default here 0: the kernel alone; on a GPU also timed against no dropout, with the time ratio)")
      ->check(CLI::Range(0.0, 0.99))
      ->capture_default_str();
  cmd->add_option("--device", a->device, "auto (the GPU when one is visible), cpu or cuda[:N]")->capture_default_str();
  cmd->add_option("--attention-backend", a->backend,
                  "GPU bf16 attention: auto or cudnn (cuDNN's fused attention where it loads, timed against the "
                  "native kernels run by run), native (moecore's tensor-core kernels only); default: "
                  "MOECORE_ATTENTION_BACKEND, else auto")
      ->check(CLI::IsMember({"auto", "cudnn", "native"}));
  return {cmd, [a] { run_bench_attention(*a); }};
}

}  // namespace moecore::cli
