// `moecore bench train`: training throughput of a small MoE GPT on --mock-data: tokens/s, model-FLOP utilization
// against a GEMM peak sampled between the steps, peak memory. Under mpirun the ranks train together in the layout
// the flags give, and the step time is split into compute and exposed communication.
#include <fmt/format.h>

#include <algorithm>

#include "moecore/cli/bench/bench_util.h"
#include "moecore/cli/bench/benches.h"
#include "moecore/cli/bench/train_run.h"
#include "moecore/core/allocator.h"
#include "moecore/core/cpu.h"
#include "moecore/device/runtime.h"
#include "moecore/kernels/gemm.h"
#include "moecore/train/config/start_config.h"

namespace moecore::cli {

namespace {
// The step's time by phase: oneDNN GEMMs, the attention kernels, the token permutation copies, communication a rank
// waited for, the optimizer, the CPU kernels with a phase timer of their own (kCpuKernelPhases), and the rest
// (residual adds, activation casts, the gradient norm's share outside the optimizer, ...).
struct Phases {
  std::vector<std::pair<std::string, double>> rows;
  double rest = 0;
};
Phases phases(const TrainRun& r) {
  const auto timer = [&r](const std::string& n) { return r.timer_s.count(n) ? r.timer_s.at(n) : 0.0; };
  Phases p;
  p.rows = {{"GEMM (oneDNN matmuls)", r.gemm_s},
            {"attention kernels", timer("attention-core")},
            {"token permutation", timer("moe-permute")},
            {"communication (waited for)", r.exposed_s},
            {"optimizer (clip + update)", timer("optimizer")}};
  for (const auto& [name, label] : kCpuKernelPhases) p.rows.push_back({label, timer(name)});
  p.rest = r.step_s;
  for (const auto& [n, s] : p.rows) p.rest -= s;
  // The phases' timers, each read around its own region, can sum to a few milliseconds over the step they split.
  p.rest = std::max(0.0, p.rest);
  p.rows.push_back({"the rest (residual adds, casts, ...)", p.rest});
  return p;
}

constexpr double kMiB = 1024.0 * 1024.0;

// The GPU's table: the phases from CUDA events on the compute stream (innermost phase wins), the rest, and the host
// synchronisations with their most frequent call sites.
void print_gpu_phases(const device::GpuProfileReport& g, double host_step_s) {
  fmt::print(
      "  the step by phase on the GPU (CUDA events on the compute stream, mean of {} timed steps; {:.3f} s from the "
      "first of {:.0f} events to the last, {:.3f} s on the host clock; calls: kernel entry points per step):\n",
      g.steps, g.step_s, g.markers, host_step_s);
  std::vector<device::Phase> order;
  for (int p = 1; p < device::kPhaseCount; p++) order.push_back(static_cast<device::Phase>(p));
  order.push_back(device::Phase::kRest);
  for (device::Phase p : order) {
    const double s = g.phase_s[static_cast<int>(p)];
    const double calls = g.entries[static_cast<int>(p)];
    if (p == device::Phase::kRest)
      fmt::print("    {:<46} {:8.3f} s  {:5.1f}%\n", device::phase_label(p), s, 100.0 * s / g.step_s);
    else
      fmt::print("    {:<46} {:8.3f} s  {:5.1f}%  {:7.0f} calls\n", device::phase_label(p), s, 100.0 * s / g.step_s,
                 calls);
  }
  const double waits = g.blocked_s_per_step + g.end_wait_s_per_step;
  fmt::print(
      "  host synchronisations: {:.1f} per step at {} call sites; the host waited {:.3f} s per step in them and {:.3f} "
      "s "
      "at the step's end, so it was busy (launching, host work) {:.3f} s of the {:.3f} s step\n",
      g.syncs_per_step, g.distinct_sites, g.blocked_s_per_step, g.end_wait_s_per_step, host_step_s - waits,
      host_step_s);
  if (g.top_sites.empty()) return;
  fmt::print("  the most frequent (frames outermost last; symbolise with addr2line -C -f -e BINARY 0xOFFSET):\n");
  for (const device::GpuProfileReport::Site& s : g.top_sites) {
    std::string frames;
    for (const std::string& f : s.frames) frames += (frames.empty() ? "" : " < ") + f;
    fmt::print("    {:6.1f}/step  {:8.3f} ms/step  {}, {:.0f} B, in {}: {}\n", s.per_step, s.blocked_ms_per_step,
               s.what, s.bytes_per_call, device::phase_key(s.phase), frames);
  }
}

// The GPU run's one-line record: every phase in seconds per step, the synchronisations and the host's wait.
std::string gpu_record(const device::GpuProfileReport& g, double comm_s) {
  std::string out;
  for (int p = 0; p < device::kPhaseCount; p++)
    out += fmt::format("{}_s={:.4f} ", device::phase_key(static_cast<device::Phase>(p)), g.phase_s[p]);
  return out +
         fmt::format("comm_s={:.3f} event_step_s={:.4f} syncs_per_step={:.1f} sync_wait_s={:.4f} end_wait_s={:.4f}",
                     comm_s, g.step_s, g.syncs_per_step, g.blocked_s_per_step, g.end_wait_s_per_step);
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
  fmt::print("  {}\n", describe_peak(a.dtype, r.peak_samples, t->device(), "the steps"));
  // The memory plan printed at start beside the allocator's peak over the timed steps (the GPU's on the GPU).
  const double planned = t->memory_plan().total(),
               peak_bytes = static_cast<double>(device::device_allocator_stats(t->device()).peak_bytes);
  fmt::print("  memory: planned {:.1f} MiB, measured peak {:.1f} MiB ({:.3f} of the plan)\n", planned / kMiB,
             peak_bytes / kMiB, peak_bytes / planned);
  std::vector<double> step_gflops;  // each timed step's model GFLOP/s per rank
  for (double s : r.steps_s) step_gflops.push_back(t->step_flops() / s / 1e9 / static_cast<double>(r.world));
  const double paired_mfu = paired_peak_ratio(step_gflops, r.peak_samples);
  fmt::print("  MFU, {}\n", describe_paired(step_gflops, r.peak_samples));
  if (r.world > 1) print_split(r);
  if (r.gpu) {
    print_gpu_phases(*r.gpu, r.step_s);
    fmt::print(
        "train dtype={} tokens_per_sec={:.0f} model_gflops={:.1f} mfu={:.3f} paired_mfu={:.3f} peak_memory_mib={:.1f} "
        "plan_memory_mib={:.1f} {}\n",
        a.dtype, tokens / step, gflops, gflops / peak, paired_mfu, peak_bytes / kMiB, planned / kMiB,
        gpu_record(*r.gpu, r.exposed_s));
    return;
  }
  const Phases ph = phases(r);
  fmt::print(
      "  GEMMs: {:.3f} s of the step ({:.0f}%) at {:.1f} GFLOP/s (oneDNN's scratchpad {:.1f} MiB); everything else "
      "{:.3f} s\n",
      r.gemm_s, 100.0 * r.gemm_s / r.step_s, r.gemm_flops / r.gemm_s / 1e9,
      static_cast<double>(kernels::gemm_stats().scratchpad_bytes) / kMiB, r.step_s - r.gemm_s);
  fmt::print("  the step by phase (mean of the timed steps; the next bottleneck is the largest):\n");
  for (const auto& [name, s] : ph.rows) fmt::print("    {:<46} {:8.3f} s  {:5.1f}%\n", name, s, 100.0 * s / r.step_s);
  // Which GEMM shapes run below the peak: on a machine where GEMMs are most of the step, the ones to look at.
  fmt::print("  the step's GEMMs by shape (the {} that take the most time):\n",
             std::min<size_t>(kGemmShapesShown, r.gemm_shapes.size()));
  print_gemm_shapes(r.gemm_shapes, peak, kGemmShapesShown);
  fmt::print(
      "train dtype={} tokens_per_sec={:.0f} model_gflops={:.1f} mfu={:.3f} paired_mfu={:.3f} peak_memory_mib={:.1f} "
      "plan_memory_mib={:.1f} gemm_s={:.3f} attention_s={:.3f} permute_s={:.3f} comm_s={:.3f} optimizer_s={:.3f} "
      "other_s={:.3f}\n",
      a.dtype, tokens / step, gflops, gflops / peak, paired_mfu, peak_bytes / kMiB, planned / kMiB, ph.rows[0].second,
      ph.rows[1].second, ph.rows[2].second, ph.rows[3].second, ph.rows[4].second, ph.rest);
}
}  // namespace

BenchCommand add_train_bench(CLI::App& bench) {
  return add_training_bench(bench, "train", "MoE GPT training step: tokens/s, MFU vs GEMM peak, peak memory",
                            TrainBenchArgs{}, run_bench_train);
}

}  // namespace moecore::cli
