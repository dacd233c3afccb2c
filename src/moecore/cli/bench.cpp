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
#include "moecore/moe/moe_layer.h"
#include "moecore/data/tokenizer.h"
#include "moecore/core/allocator.h"
#include "moecore/train/trainer.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

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
  const auto [best, med] = kernels::time_square_gemm(dtype, n, iters);
  return {best, med};
}

double gemm_peak(DType dtype) { return kernels::measure_gemm_peak_gflops(dtype); }

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
  const double peak = gemm_peak(DType::F32);
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
  fmt::print("  f32 GEMM peak (best of M=N=K 1024/2048): {:.1f} GFLOP/s\n", peak);
  fmt::print("  attention forward:          {:8.1f} GFLOP/s  ({:.1f}% of GEMM peak)\n", fwd, 100.0 * fwd / peak);
  fmt::print("  attention forward+backward: {:8.1f} GFLOP/s  ({:.1f}% of GEMM peak)\n", tot, 100.0 * tot / peak);
}

void run_bench_moe_layer(const MoEBenchArgs& a) {
  MOE_CHECK(a.dtype == "f32" || a.dtype == "bf16", "--dtype must be f32 or bf16, got {}", a.dtype);
  const bool bf16 = a.dtype == "bf16";
  fmt::print("moecore bench moe-layer: T={} H={} F={} E={} k={} dtype={} SwiGLU, {} timed runs, {} threads\n",
             a.tokens, a.hidden, a.ffn, a.experts, a.topk, a.dtype, a.iters, num_threads());
  moe::MoELayerConfig c;
  c.router.hidden = a.hidden;
  c.router.num_experts = a.experts;
  c.router.topk = a.topk;
  c.router.force_load_balancing = a.force_balance;
  c.ffn_hidden = a.ffn;
  c.bf16 = bf16;
  nn::ParamRegistry reg(DType::F32);
  moe::MoELayer layer(reg, "mlp", c);
  reg.initialize(1);
  Tensor x = Tensor::empty({a.tokens, 1, a.hidden}, DType::F32), dy = Tensor::empty(x.shape(), DType::F32);
  fill_random(x, 7, 1.0);
  fill_random(dy, 8, 1.0);
  auto st = layer.make_stash();
  // Three H×F GEMMs per routed token (fc1 gate and linear halves, fc2), 2 FLOPs per multiply-add, ×3 for
  // forward + backward (data and weight gradients).
  const double flops = 3.0 * 2.0 * a.hidden * a.ffn * static_cast<double>(a.tokens * a.topk) * 3.0;
  std::vector<double> rates;
  for (int i = 0; i <= a.iters; i++) {
    reg.zero_grad();
    const double t0 = now_s();
    layer.forward(x, *st);
    layer.backward(dy, *st);
    const double dt = now_s() - t0;
    if (i > 0) rates.push_back(flops / dt / 1e9);
  }
  const double rate = median(rates);
  const double peak = gemm_peak(bf16 ? DType::BF16 : DType::F32);
  fmt::print("  load: max/mean tokens per expert {:.2f} (over {} steps)\n",
             layer.stats().max_load() / layer.stats().mean_load(), a.iters + 1);
  fmt::print("  {} GEMM peak (best of M=N=K 1024/2048): {:.1f} GFLOP/s\n", a.dtype, peak);
  fmt::print("moe_layer dtype={} gflops={:.1f} peak_gflops={:.1f} ratio={:.3f}\n", a.dtype, rate, peak, rate / peak);
}

void run_bench_train(const TrainBenchArgs& a) {
  MOE_CHECK(a.dtype == "f32" || a.dtype == "bf16", "--dtype must be f32 or bf16, got {}", a.dtype);
  // Hidden size 1024, 8 experts top-2 (each as wide as the hidden size), 32k vocabulary, 256-token sequences.
  std::vector<std::string> flags{"--num-layers", "4", "--hidden-size", "1024", "--num-attention-heads", "16",
                                 "--group-query-attention", "--num-query-groups", "4", "--swiglu",
                                 "--disable-bias-linear", "--num-experts", "8", "--moe-router-topk", "2",
                                 "--moe-ffn-hidden-size", "1024", "--moe-aux-loss-coeff", "1e-2", "--seq-length", "256",
                                 "--micro-batch-size", "4", "--global-batch-size", "8", "--mock-data", "--vocab-size",
                                 "32000", "--train-iters", std::to_string(a.iters + 1), "--lr", "1e-4",
                                 "--eval-iters", "0", "--log-interval", "1000000"};
  if (a.dtype == "bf16") flags.push_back("--bf16");
  flags.insert(flags.end(), a.train_flags.begin(), a.train_flags.end());
  const train::TrainConfig cfg = train::parse_train_config(flags);
  std::FILE* null = std::fopen("/dev/null", "w");
  train::Trainer t(cfg, null, /*measure_peak=*/false);
  const double peak = kernels::measure_gemm_peak_gflops(a.dtype == "bf16" ? DType::BF16 : DType::F32);
  t.train_step();  // warm-up: primitives, allocator cache
  Allocator::instance().reset_peak();
  const double t0 = now_s();
  for (int i = 0; i < a.iters; i++) t.train_step();
  const double dt = (now_s() - t0) / a.iters;
  std::fclose(null);
  const double tokens = static_cast<double>(cfg.global_batch_size * cfg.seq_length);
  const double gflops = t.step_flops() / dt / 1e9;
  fmt::print("moecore bench train: {} layers, H={}, {} experts top-{} (F={}), S={}, global batch {} x {}, {}, {} threads\n",
             cfg.num_layers, cfg.hidden_size, cfg.num_experts, cfg.moe_router_topk, cfg.moe_ffn_hidden_size,
             cfg.seq_length, cfg.global_batch_size, cfg.micro_batch_size, a.dtype, num_threads());
  fmt::print("  {:.2f} M parameters; step {:.3f} s; {} GEMM peak (best of M=N=K 1024/2048) {:.1f} GFLOP/s\n",
             static_cast<double>(t.params().numel()) / 1e6, dt, a.dtype, peak);
  fmt::print("train dtype={} tokens_per_sec={:.0f} model_gflops={:.1f} mfu={:.3f} peak_memory_mib={:.1f}\n", a.dtype,
             tokens / dt, gflops, gflops / peak,
             static_cast<double>(Allocator::instance().stats().peak_bytes) / (1024.0 * 1024.0));
}

namespace {
std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  MOE_CHECK(f.good(), "cannot open {}", path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}
}  // namespace

void run_bench_tokenizer(const std::string& tokenizer_json, const std::string& input, int workers) {
  MOE_CHECK(workers >= 1, "--workers must be >= 1, got {}", workers);
  std::string text;
  if (input.empty()) {
    for (const char* f : {"fortunes", "literature", "riddles", "science", "wisdom", "people", "computers", "humorists"}) {
      const std::string p = std::string("/usr/share/games/fortunes/") + f;
      if (std::filesystem::exists(p)) text += read_text(p);
    }
    MOE_CHECK(!text.empty(), "no default text: the Debian package 'fortunes' is not installed; pass --input FILE");
  } else {
    text = read_text(input);
  }
  // Documents: paragraphs separated by the fortune delimiter or blank lines, as a JSONL corpus would give them.
  std::vector<std::string> docs;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find("\n%\n", pos);
    end = end == std::string::npos ? text.size() : end + 3;
    docs.push_back(text.substr(pos, end - pos));
    pos = end;
  }
  const double mb = static_cast<double>(text.size()) / 1e6;
  const double t0 = now_s();
  const data::Tokenizer tok = data::Tokenizer::from_file(tokenizer_json);
  fmt::print("moecore bench tokenizer: {} ({} tokens), {:.2f} MB of text in {} documents; load {:.2f} s\n",
             tokenizer_json, tok.vocab_size(), mb, docs.size(), now_s() - t0);
  // One thread runs on the calling thread, so its second pass sees the piece cache a long preprocessing run
  // would have (steady state); worker runs start fresh threads with cold caches (a conservative figure).
  auto run = [&](int nthreads) {
    std::vector<std::thread> threads;
    std::vector<int64_t> counts(static_cast<size_t>(nthreads), 0);
    auto work = [&](int w) {
      for (size_t i = static_cast<size_t>(w); i < docs.size(); i += static_cast<size_t>(nthreads))
        counts[static_cast<size_t>(w)] += static_cast<int64_t>(tok.encode(docs[i]).size());
    };
    const double t = now_s();
    if (nthreads == 1) {
      work(0);
    } else {
      for (int w = 0; w < nthreads; w++) threads.emplace_back(work, w);
    }
    for (auto& th : threads) th.join();
    const double dt = now_s() - t;
    int64_t tokens = 0;
    for (int64_t c : counts) tokens += c;
    return std::make_pair(mb / dt, tokens);
  };
  const auto [cold, tokens] = run(1);
  const auto [one, tokens2] = run(1);
  MOE_ASSERT(tokens2 == tokens);
  fmt::print("  1 thread:  {:7.2f} MB/s steady state, {:.2f} MB/s from a cold cache ({} tokens, {:.2f} bytes/token)\n",
             one, cold, tokens, static_cast<double>(text.size()) / static_cast<double>(tokens));
  if (workers > 1) {
    const auto [many, t2] = run(workers);
    MOE_ASSERT(t2 == tokens);
    fmt::print("  {} workers: {:7.2f} MB/s from cold caches ({:.2f} MB/s per worker)\n", workers, many, many / workers);
  }
}

}  // namespace moecore::cli
