// Benchmarks (see bench.h).
#include "moecore/cli/bench.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <thread>
#include <vector>

#include "moecore/ckpt/checkpoint.h"
#include "moecore/comm/process_group.h"
#include "moecore/core/allocator.h"
#include "moecore/core/cpu.h"
#include "moecore/core/rng.h"
#include "moecore/core/tensor.h"
#include "moecore/data/tokenizer.h"
#include "moecore/kernels/cpu/attention.h"
#include "moecore/kernels/cpu/gemm.h"
#include "moecore/moe/moe_layer.h"
#include "moecore/train/trainer.h"

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
  const bool bf16 = a.dtype == "bf16";
  MOE_CHECK(!bf16 || a.seq <= kernels::kMaxBf16AttentionSeq, "bf16 attention runs up to --seq-length {}, got {}",
            kernels::kMaxBf16AttentionSeq, a.seq);
  fmt::print(
      "moecore bench attention: S={} B={} heads={} kv_heads={} head_dim={} causal, {}, {} timed runs, {} "
      "threads\n",
      a.seq, a.batch, a.heads, a.kv_heads, a.head_dim, a.dtype, a.iters, num_threads());
  const double peak = gemm_peak(bf16 ? DType::BF16 : DType::F32);
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
    if (bf16)
      kernels::attention_forward_bf16(q, k, v, scale, o, lse);
    else
      kernels::attention_forward(q, k, v, scale, o, lse);
    const double t1 = now_s();
    if (bf16)
      kernels::attention_backward_bf16(dout, q, k, v, o, lse, scale, dq, dk, dv);
    else
      kernels::attention_backward(dout, q, k, v, o, lse, scale, dq, dk, dv);
    const double t2 = now_s();
    if (i == 0) continue;  // warm-up
    fwd_rates.push_back(fwd_flops / (t1 - t0) / 1e9);
    total_rates.push_back(3.5 * fwd_flops / (t2 - t0) / 1e9);
  }
  const double fwd = median(fwd_rates), tot = median(total_rates);
  fmt::print("  {} GEMM peak (best of M=N=K 1024/2048): {:.1f} GFLOP/s\n", a.dtype, peak);
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
  layer.finish_global_batch();  // the steps so far as one global batch
  const nn::RoutingStats& load = *layer.routing_stats();
  fmt::print("  load: max/mean tokens per expert {:.2f} (over {} steps)\n", load.max_load() / load.mean_load(),
             a.iters + 1);
  fmt::print("  {} GEMM peak (best of M=N=K 1024/2048): {:.1f} GFLOP/s\n", a.dtype, peak);
  fmt::print("moe_layer dtype={} gflops={:.1f} peak_gflops={:.1f} ratio={:.3f}\n", a.dtype, rate, peak, rate / peak);
}

namespace {
struct TrainRun {
  double step_s = 0, step_median_s = 0, exposed_s = 0, exposed_max_s = 0;
  double gemm_s = 0, gemm_flops = 0;  // per step: time inside oneDNN matmuls and their FLOPs
  std::vector<double> peak_samples;   // GEMM GFLOP/s measured between the timed steps (when asked)
  int64_t world = 1, rank = 0;
  std::map<std::string, comm::CommCounter> counters;  // of the timed steps only
};

// One reference GEMM rate: the best of 3 runs of an M=N=K=2048 product (tens of milliseconds).
double gemm_rate_sample(DType dtype) {
  return kernels::time_square_gemm(dtype, 2048, 3).first;
}

// Trains `flags` over the MPI world (one rank without mpirun): one warm-up step, then `iters` timed steps with
// the communication counters cleared in between. With `peak`, a reference GEMM rate of that dtype is sampled on
// every rank before each timed step and after the last, so the peak an MFU divides by is measured in the same
// conditions as the steps (on a shared machine both swing together).
TrainRun timed_train(const train::TrainConfig& cfg, int iters, std::unique_ptr<train::Trainer>& out,
                     std::optional<DType> peak = std::nullopt) {
  comm::ProcessGroup::init(nullptr, nullptr);
  const comm::ProcessGroup world = comm::ProcessGroup::world();
  std::FILE* null = std::fopen("/dev/null", "w");
  out = std::make_unique<train::Trainer>(cfg, null, /*measure_peak=*/false, &world);
  train::Trainer& t = *out;
  t.train_step();  // warm-up: primitives, allocator cache
  Allocator::instance().reset_peak();
  comm::comm_counters().clear();
  TrainRun r;
  std::vector<double> steps;
  for (int i = 0; i <= iters; i++) {
    if (peak) {
      world.barrier();
      r.peak_samples.push_back(gemm_rate_sample(*peak));
    }
    if (i == iters) break;
    world.barrier();
    const kernels::GemmStats g0 = kernels::gemm_stats();
    const double t0 = now_s();
    t.train_step();
    world.barrier();
    steps.push_back(now_s() - t0);
    const kernels::GemmStats g1 = kernels::gemm_stats();
    r.gemm_s += (g1.seconds - g0.seconds) / iters;
    r.gemm_flops += (g1.flops - g0.flops) / iters;
  }
  for (double s : steps) r.step_s += s / iters;
  r.step_median_s = median(steps);
  r.counters = comm::comm_counters();
  for (const auto& [k, c] : r.counters) r.exposed_s += c.blocked_seconds / iters;
  Tensor e = Tensor::empty({1}, DType::F64);
  e.set_item(0, r.exposed_s);
  if (world.size() > 1) world.all_reduce(e, comm::ReduceOp::Max);
  r.exposed_max_s = e.item(0);
  r.world = world.size();
  r.rank = world.rank();
  std::fclose(null);
  return r;
}

// The benchmark's model and run flags, overridden by the user's.
std::vector<std::string> bench_model_flags(const TrainBenchArgs& a, std::vector<std::string> flags) {
  if (a.dtype == "bf16") flags.push_back("--bf16");
  flags.insert(flags.end(), {"--mock-data", "--train-iters", std::to_string(a.iters + 1), "--lr", "1e-4",
                             "--eval-iters", "0", "--log-interval", "1000000"});
  return train::override_flags(flags, a.train_flags);
}

void print_split(const TrainRun& r) {
  fmt::print("  step {:.3f} s = compute {:.3f} s + exposed communication {:.3f} s ({:.1f}%; slowest rank {:.3f} s)\n",
             r.step_s, r.step_s - r.exposed_s, r.exposed_s, 100.0 * r.exposed_s / r.step_s, r.exposed_max_s);
}
}  // namespace

void run_bench_train(const TrainBenchArgs& a) {
  MOE_CHECK(a.dtype == "f32" || a.dtype == "bf16", "--dtype must be f32 or bf16, got {}", a.dtype);
  // Hidden size 1024, 8 experts top-2 (each as wide as the hidden size), 32k vocabulary, 256-token sequences.
  const train::TrainConfig cfg = train::parse_train_config(bench_model_flags(a, {"--num-layers",
                                                                                 "4",
                                                                                 "--hidden-size",
                                                                                 "1024",
                                                                                 "--num-attention-heads",
                                                                                 "16",
                                                                                 "--group-query-attention",
                                                                                 "--num-query-groups",
                                                                                 "4",
                                                                                 "--swiglu",
                                                                                 "--disable-bias-linear",
                                                                                 "--num-experts",
                                                                                 "8",
                                                                                 "--moe-router-topk",
                                                                                 "2",
                                                                                 "--moe-ffn-hidden-size",
                                                                                 "1024",
                                                                                 "--moe-aux-loss-coeff",
                                                                                 "1e-2",
                                                                                 "--seq-length",
                                                                                 "256",
                                                                                 "--micro-batch-size",
                                                                                 "4",
                                                                                 "--global-batch-size",
                                                                                 "8",
                                                                                 "--vocab-size",
                                                                                 "32000"}));
  std::unique_ptr<train::Trainer> t;
  const TrainRun r = timed_train(cfg, a.iters, t, a.dtype == "bf16" ? DType::BF16 : DType::F32);
  if (r.rank != 0) return;
  const double tokens = static_cast<double>(cfg.global_batch_size * cfg.seq_length);
  const double step = r.step_median_s, peak = median(r.peak_samples);
  const double gflops = t->step_flops() / step / 1e9 / static_cast<double>(r.world);  // per rank
  fmt::print("moecore bench train: {} layers, H={}, {} experts top-{} (F={}), S={}, global batch {} x {}, {}, {} "
             "threads, {} rank(s)\n",
             cfg.num_layers, cfg.hidden_size, cfg.num_experts, cfg.moe_router_topk, cfg.moe_ffn_hidden_size,
             cfg.seq_length, cfg.global_batch_size, cfg.micro_batch_size, a.dtype, num_threads(), r.world);
  fmt::print("  {:.2f} M parameters on rank 0; step {:.3f} s (median of {}; mean {:.3f} s)\n",
             static_cast<double>(t->params().numel()) / 1e6, step, a.iters, r.step_s);
  fmt::print(
      "  {} GEMM peak {:.1f} GFLOP/s: median of {} samples taken between the steps, each the best of 3 "
      "M=N=K=2048 runs (range {:.1f}-{:.1f})\n",
      a.dtype, peak, r.peak_samples.size(), *std::min_element(r.peak_samples.begin(), r.peak_samples.end()),
      *std::max_element(r.peak_samples.begin(), r.peak_samples.end()));
  if (r.world > 1) print_split(r);
  fmt::print("  GEMMs: {:.3f} s of the step ({:.0f}%) at {:.1f} GFLOP/s; everything else {:.3f} s\n", r.gemm_s,
             100.0 * r.gemm_s / r.step_s, r.gemm_flops / r.gemm_s / 1e9, r.step_s - r.gemm_s);
  fmt::print("train dtype={} tokens_per_sec={:.0f} model_gflops={:.1f} mfu={:.3f} peak_memory_mib={:.1f}\n", a.dtype,
             tokens / step, gflops, gflops / peak,
             static_cast<double>(Allocator::instance().stats().peak_bytes) / (1024.0 * 1024.0));
}

void run_bench_comm(const TrainBenchArgs& a) {
  MOE_CHECK(a.dtype == "f32" || a.dtype == "bf16", "--dtype must be f32 or bf16, got {}", a.dtype);
  const train::TrainConfig cfg = train::parse_train_config(bench_model_flags(
      a, {"--num-layers", "2", "--hidden-size", "256", "--num-attention-heads", "8", "--swiglu",
          "--disable-bias-linear", "--num-experts", "8", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "256",
          "--moe-router-force-load-balancing", "--seq-length", "256", "--micro-batch-size", "2",
          "--global-batch-size", "8", "--vocab-size", "4096"}));
  std::unique_ptr<train::Trainer> t;
  const TrainRun r = timed_train(cfg, a.iters, t);
  // Per group: measured bytes received per step (this rank), against the analytic minimum.
  std::map<std::string, double> measured;
  for (const auto& [k, c] : r.counters) measured[k.substr(0, k.find(':'))] += c.received_bytes / a.iters;
  const auto analytic = t->analytic_comm_bytes();
  {  // mean over ranks (routing spreads rows unevenly between ranks; the mean is what the analytic figure models)
    const comm::ProcessGroup world = comm::ProcessGroup::world();
    Tensor v = Tensor::zeros({static_cast<int64_t>(analytic.size())}, DType::F64);
    int64_t i = 0;
    for (const auto& [g, bytes] : analytic) v.set_item(i++, measured.count(g) ? measured[g] : 0.0);
    world.all_reduce(v);
    i = 0;
    for (const auto& [g, bytes] : analytic) measured[g] = v.item(i++) / static_cast<double>(r.world);
  }
  if (r.rank != 0) return;
  fmt::print("moecore bench comm: {} ranks, TP={} EP={} ETP={} (DP and EDP fill the rest), {} dispatcher, {}, "
             "{} layers H={} S={} global batch {} x {}\n",
             r.world, cfg.tensor_model_parallel_size, cfg.expert_model_parallel_size, cfg.expert_tensor_parallel_size,
             cfg.moe_token_dispatcher_type, a.dtype, cfg.num_layers, cfg.hidden_size, cfg.seq_length,
             cfg.global_batch_size, cfg.micro_batch_size);
  fmt::print("  {:<28} {:>7} {:>14} {:>14} {:>10}\n", "group:collective (rank 0)", "calls", "payload MiB",
             "received MiB", "blocked s");
  const double mib = 1024.0 * 1024.0;
  for (const auto& [k, c] : r.counters)
    fmt::print("  {:<28} {:>7.1f} {:>14.3f} {:>14.3f} {:>10.4f}\n", k, static_cast<double>(c.calls) / a.iters,
               c.payload_bytes / a.iters / mib, c.received_bytes / a.iters / mib, c.blocked_seconds / a.iters);
  fmt::print("  per group, per step, mean over ranks: received vs analytic minimum (uniform routing, "
             "bandwidth-optimal collectives)\n");
  for (const auto& [g, bytes] : analytic) {
    const double m = measured.count(g) ? measured[g] : 0.0;
    fmt::print("comm group={} received_mib={:.3f} analytic_mib={:.3f} ratio={:.3f}\n", g, m / mib, bytes / mib,
               bytes > 0 ? m / bytes : 0.0);
  }
  for (const auto& [g, m] : measured)
    if (!analytic.count(g)) fmt::print("  {}: {:.4f} MiB of metadata and statistics (no analytic bulk term)\n", g, m / mib);
  print_split(r);
}


void run_bench_tokenizer(const std::string& tokenizer_json, const std::string& input, int workers) {
  MOE_CHECK(workers >= 1, "--workers must be >= 1, got {}", workers);
  std::string text;
  if (input.empty()) {
    for (const char* f : {"fortunes", "literature", "riddles", "science", "wisdom", "people", "computers", "humorists"}) {
      const std::string p = std::string("/usr/share/games/fortunes/") + f;
      if (std::filesystem::exists(p)) text += ckpt::read_file(p);
    }
    MOE_CHECK(!text.empty(), "no default text: the Debian package 'fortunes' is not installed; pass --input FILE");
  } else {
    text = ckpt::read_file(input);
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

namespace {
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The baseline: `tensors` written one after another into one file and fsynced, then read back in the same order.
std::pair<double, double> plain_write_read(const std::string& path, const std::vector<Tensor>& tensors) {
  auto t0 = std::chrono::steady_clock::now();
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  MOE_CHECK(fd >= 0, "cannot create {}", path);
  for (const auto& t : tensors) {
    const char* p = static_cast<const char*>(t.raw());
    size_t left = t.nbytes();
    while (left > 0) {
      const ssize_t w = ::write(fd, p, left);
      MOE_CHECK(w > 0, "cannot write {}", path);
      p += w;
      left -= static_cast<size_t>(w);
    }
  }
  MOE_CHECK(::fsync(fd) == 0 && ::close(fd) == 0, "cannot fsync {}", path);
  const double write_s = seconds_since(t0);
  t0 = std::chrono::steady_clock::now();
  fd = ::open(path.c_str(), O_RDONLY);
  MOE_CHECK(fd >= 0, "cannot open {}", path);
  for (const auto& t : tensors) {
    Tensor into = Tensor::empty(t.shape(), t.dtype());
    char* p = static_cast<char*>(into.raw());
    size_t left = into.nbytes();
    while (left > 0) {
      const ssize_t r = ::read(fd, p, left);
      MOE_CHECK(r > 0, "cannot read {}", path);
      p += r;
      left -= static_cast<size_t>(r);
    }
  }
  ::close(fd);
  return {write_s, seconds_since(t0)};
}
}  // namespace

void run_bench_checkpoint(const CheckpointBenchArgs& a) {
  namespace fs = std::filesystem;
  TrainBenchArgs ta;
  ta.dtype = "f32";
  ta.iters = 1;
  ta.train_flags = a.train_flags;
  ta.train_flags.insert(ta.train_flags.end(), {"--save", a.dir + "/ckpt"});
  // About 55 M parameters: 0.66 GB of weights and Adam moments per checkpoint.
  const train::TrainConfig cfg = train::parse_train_config(bench_model_flags(
      ta, {"--num-layers", "4", "--hidden-size", "512", "--num-attention-heads", "8", "--swiglu",
           "--disable-bias-linear", "--num-experts", "8", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "1024",
           "--seq-length", "64", "--micro-batch-size", "1", "--global-batch-size", "1", "--vocab-size", "32000"}));
  fs::remove_all(a.dir);
  fs::create_directories(a.dir);
  std::FILE* null = std::fopen("/dev/null", "w");
  train::Trainer t(cfg, null, false);
  t.train_step();  // non-zero moments
  // What the checkpoint holds, for the load targets and the baseline.
  std::vector<Tensor> moments;
  std::vector<ckpt::LoadTarget> targets;
  std::vector<Tensor> same_bytes;
  for (auto& p : t.params().all()) {
    targets.push_back({p->name, ckpt::box_of(*p), &p->value});
    for (int k = 0; k < 3; k++) same_bytes.push_back(p->value);  // weights and two moments' worth
    for (int k = 0; k < 2; k++) moments.push_back(Tensor::empty(p->value.shape(), DType::F32));
  }
  size_t mi = 0;
  for (auto& p : t.params().all())
    for (const char* k : {"optimizer.exp_avg.", "optimizer.exp_avg_sq."})
      targets.push_back({k + p->name, ckpt::box_of(*p), &moments[mi++]});
  double save_best = 1e30, load_best = 1e30, write_best = 1e30, read_best = 1e30;
  std::string dir;
  for (int i = 0; i < a.iters; i++) {
    auto t0 = std::chrono::steady_clock::now();
    dir = t.save_checkpoint();
    save_best = std::min(save_best, seconds_since(t0));
    t0 = std::chrono::steady_clock::now();
    ckpt::load_tensors(dir, targets);
    load_best = std::min(load_best, seconds_since(t0));
    const auto [w, r] = plain_write_read(a.dir + "/plain.bin", same_bytes);
    write_best = std::min(write_best, w);
    read_best = std::min(read_best, r);
  }
  std::fclose(null);
  double bytes = 0;
  for (const auto& e : fs::directory_iterator(dir)) bytes += static_cast<double>(e.file_size());
  double plain = 0;
  for (const auto& x : same_bytes) plain += static_cast<double>(x.nbytes());
  fmt::print("moecore bench checkpoint: {:.1f} M parameters, {:.2f} GB per checkpoint (weights + Adam moments, "
             "index, state) in {}, best of {}\n",
             static_cast<double>(t.params().numel()) / 1e6, bytes / 1e9, a.dir, a.iters);
  fmt::print("checkpoint save_gbps={:.2f} plain_write_gbps={:.2f} ratio={:.2f} (checksums, fsync, rename)\n",
             bytes / save_best / 1e9, plain / write_best / 1e9, (bytes / save_best) / (plain / write_best));
  fmt::print("checkpoint load_gbps={:.2f} plain_read_gbps={:.2f} ratio={:.2f} (index validation, checksums, copies "
             "into the layout; reads from the page cache for both)\n",
             bytes / load_best / 1e9, plain / read_best / 1e9, (bytes / load_best) / (plain / read_best));
  fs::remove_all(a.dir);
}

}  // namespace moecore::cli
