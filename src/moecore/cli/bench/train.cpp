// `moecore bench train`: training throughput of a small MoE GPT on --mock-data: tokens/s, model-FLOP utilization
// against a GEMM peak sampled between the steps, peak memory. Under mpirun the ranks train together in the layout
// the flags give, and the step time is split into compute and exposed communication.
#include <fmt/format.h>

#include <algorithm>

#include "moecore/cli/bench/benches.h"
#include "moecore/cli/bench/common.h"
#include "moecore/cli/bench/train_run.h"
#include "moecore/core/allocator.h"
#include "moecore/core/cpu.h"
#include "moecore/cuda/runtime.h"
#include "moecore/train/start_config.h"

namespace moecore::cli {

namespace {
// The step's time by phase: oneDNN GEMMs, the attention kernels, the token permutation copies, communication a rank
// waited for, the optimizer, and the rest (norms, activations, RoPE, router, casts, losses, gradient norm).
struct Phases {
  std::vector<std::pair<std::string, double>> rows;
};
Phases phases(const TrainRun& r) {
  const auto timer = [&r](const char* n) { return r.timer_s.count(n) ? r.timer_s.at(n) : 0.0; };
  Phases p;
  p.rows = {{"GEMM (oneDNN matmuls)", r.gemm_s},
            {"attention kernels", timer("attention-core")},
            {"token permutation", timer("moe-permute")},
            {"communication (waited for)", r.exposed_s},
            {"optimizer (clip + update)", timer("optimizer")}};
  double other = r.step_s;
  for (const auto& [n, s] : p.rows) other -= s;
  p.rows.push_back({"the rest (norms, activations, router, casts)", other});
  return p;
}

void run_bench_train(const TrainBenchArgs& a) {
  // Hidden size 1024, 8 experts top-2 (each as wide as the hidden size), 32k vocabulary, 256-token sequences.
  // Level-2 timers (no barriers) for the phase table, unless the user asked for other timing.
  // `--num-experts 0` among the user's flags benchmarks the dense model: the MoE flags are left out.
  const auto& f = a.train_flags;
  bool dense = false;
  for (size_t i = 0; i + 1 < f.size(); i++) dense = dense || (f[i] == "--num-experts" && f[i + 1] == "0");
  const std::string moe = dense ? ""
                                : "--num-experts 8 --moe-router-topk 2 --moe-ffn-hidden-size 1024 "
                                  "--moe-aux-loss-coeff 1e-2 ";
  const train::TrainConfig cfg = train::parse_train_config(train::override_flags(
      {"--timing-log-level", "2", "--no-barrier-with-level-1-timing"},
      bench_model_flags(a,
                        "--normalization RMSNorm --position-embedding-type rope "
                        "--num-layers 4 --hidden-size 1024 --num-attention-heads 16 --group-query-attention "
                        "--num-query-groups 4 --swiglu --disable-bias-linear " +
                            moe + "--seq-length 256 --micro-batch-size 4 --global-batch-size 8 --vocab-size 32000")));
  std::unique_ptr<train::Trainer> t;
  const TrainRun r = timed_train(cfg, a.iters, t, a.dtype == "bf16" ? DType::BF16 : DType::F32);
  if (r.rank != 0) return;
  const double tokens = static_cast<double>(cfg.global_batch_size * cfg.seq_length);
  const double step = r.step_median_s, peak = median(r.peak_samples);
  const double gflops = t->step_flops() / step / 1e9 / static_cast<double>(r.world);  // per rank
  fmt::print(
      "moecore bench train: {} layers, H={}, {} experts top-{} (F={}), S={}, global batch {} x {}, {}, {} "
      "threads, {} rank(s)\n",
      cfg.num_layers, cfg.hidden_size, cfg.num_experts, cfg.moe_router_topk, cfg.moe_ffn_hidden_size, cfg.seq_length,
      cfg.global_batch_size, cfg.micro_batch_size, a.dtype, num_threads(), r.world);
  fmt::print("  {:.2f} M parameters on rank 0; step {:.3f} s (median of {}; mean {:.3f} s)\n",
             static_cast<double>(t->params().numel()) / 1e6, step, a.iters, r.step_s);
  fmt::print(
      "  {} GEMM peak {:.1f} GFLOP/s: median of {} samples taken between the steps, each the best of 3 "
      "M=N=K={} runs on {} (range {:.1f}-{:.1f})\n",
      a.dtype, peak, r.peak_samples.size(), t->device().is_cuda() ? 8192 : 2048, t->device().str(),
      *std::min_element(r.peak_samples.begin(), r.peak_samples.end()),
      *std::max_element(r.peak_samples.begin(), r.peak_samples.end()));
  if (r.world > 1) print_split(r);
  const Phases ph = phases(r);
  if (t->device().is_cuda()) {  // host timers around asynchronous kernels would mislead
    fmt::print("  the step by phase: not timed on the GPU (kernels run asynchronously to the host's timers)\n");
  } else {
    fmt::print("  GEMMs: {:.3f} s of the step ({:.0f}%) at {:.1f} GFLOP/s; everything else {:.3f} s\n", r.gemm_s,
               100.0 * r.gemm_s / r.step_s, r.gemm_flops / r.gemm_s / 1e9, r.step_s - r.gemm_s);
    fmt::print("  the step by phase (mean of the timed steps; the next bottleneck is the largest):\n");
    for (const auto& [name, s] : ph.rows) fmt::print("    {:<46} {:8.3f} s  {:5.1f}%\n", name, s, 100.0 * s / r.step_s);
  }
  fmt::print(
      "train dtype={} tokens_per_sec={:.0f} model_gflops={:.1f} mfu={:.3f} peak_memory_mib={:.1f} gemm_s={:.3f} "
      "attention_s={:.3f} permute_s={:.3f} comm_s={:.3f} optimizer_s={:.3f} other_s={:.3f}\n",
      a.dtype, tokens / step, gflops, gflops / peak,
      static_cast<double>(t->device().is_cuda() ? cuda::device_allocator_stats(t->device()).peak_bytes
                                                : Allocator::instance().stats().peak_bytes) /
          (1024.0 * 1024.0),
      ph.rows[0].second, ph.rows[1].second, ph.rows[2].second, ph.rows[3].second, ph.rows[4].second, ph.rows[5].second);
}
}  // namespace

BenchCommand add_train_bench(CLI::App& bench) {
  return add_training_bench(bench, "train", "MoE GPT training step: tokens/s, MFU vs GEMM peak, peak memory",
                            TrainBenchArgs{}, run_bench_train);
}

}  // namespace moecore::cli
