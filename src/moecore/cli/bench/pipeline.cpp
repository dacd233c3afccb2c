// `moecore bench pipeline`: pipeline parallelism under mpirun (PP = the world by default; --pipeline-model-parallel-
// size and --num-virtual-stages-per-pipeline-rank override). Per stage: the measured bubble (the share of the
// step's passes spent waiting for a neighbour) against Megatron's (P−1)/(m+P−1) for 1F1B and (P−1)/(v·m+P−1)
// interleaved, the peak number of micro-batch activations held at once against the schedule's warm-up + 1, and the
// point-to-point bytes sent against the analytic count.
#include <fmt/format.h>

#include <algorithm>

#include "moecore/cli/bench/benches.h"
#include "moecore/cli/bench/train_run.h"
#include "moecore/core/allocator.h"
#include "moecore/core/error.h"
#include "moecore/train/config/start_config.h"
#include "moecore/train/pipeline/pipeline_stages.h"

namespace moecore::cli {

namespace {
void run_bench_pipeline(const TrainBenchArgs& a) {
  comm::ProcessGroup::init(nullptr, nullptr);
  const comm::ProcessGroup world = comm::ProcessGroup::world();
  TrainBenchArgs args = a;
  // PP over every rank unless the user's flags say otherwise (theirs come later and win).
  if (std::find(args.train_flags.begin(), args.train_flags.end(), "--pipeline-model-parallel-size") ==
      args.train_flags.end())
    args.train_flags.insert(args.train_flags.end(), {"--pipeline-model-parallel-size", std::to_string(world.size())});
  const train::TrainConfig cfg = train::parse_train_config(bench_model_flags(
      args,
      "--normalization RMSNorm --position-embedding-type rope "
      "--num-layers 8 --hidden-size 256 --num-attention-heads 8 --swiglu --disable-bias-linear --num-experts 8 "
      "--moe-router-topk 2 --moe-ffn-hidden-size 256 --moe-router-force-load-balancing --seq-length 256 "
      "--micro-batch-size 1 --global-batch-size 16 --vocab-size 4096"));
  MOE_CHECK(cfg.pipeline_model_parallel_size > 1,
            "bench pipeline needs --pipeline-model-parallel-size > 1 (run "
            "it under mpirun with 2 or more ranks)");
  std::unique_ptr<train::Trainer> t;
  const TrainRun r = timed_train(cfg, a.iters, t);
  const train::PipelineSchedule& s = *t->pipeline();
  const int64_t P = cfg.pipeline_model_parallel_size, v = train::virtual_stages(cfg);
  const int64_t dp = world.size() / (P * cfg.tensor_model_parallel_size * cfg.context_parallel_size);
  const int64_t m = cfg.global_batch_size / (cfg.micro_batch_size * dp);
  const int64_t group = cfg.microbatch_group_size_per_vp_stage > 0 ? cfg.microbatch_group_size_per_vp_stage : P;
  // Per rank: [pp rank, bubble, peak in flight, bytes sent per step, analytic bytes per step, activation peak],
  // gathered. The activation peak: the allocator's peak over the run less what stays live between steps (weights,
  // gradients, optimizer state), i.e. the stashes of the micro-batches in flight and the passes' temporaries.
  const int64_t pp_rank = (world.rank() / (world.size() / P));  // pp is the outermost axis of RankGenerator
  const double msg =
      static_cast<double>(cfg.seq_length / cfg.tensor_model_parallel_size * cfg.micro_batch_size * cfg.hidden_size * 4);
  // Forward: every chunk but the last stage's last sends its output; backward: every chunk but the first stage's
  // first sends its input's gradient. Once per micro-batch.
  const double analytic =
      static_cast<double>(m) * msg * static_cast<double>(2 * v - (pp_rank == P - 1 ? 1 : 0) - (pp_rank == 0 ? 1 : 0));
  constexpr int64_t kFields = 6;
  Tensor mine = Tensor::zeros({world.size() * kFields}, DType::F64);
  const int64_t o = world.rank() * kFields;
  mine.set_item(o, static_cast<double>(pp_rank));
  mine.set_item(o + 1, s.passes_seconds() > 0 ? s.waited_seconds() / s.passes_seconds() : 0.0);
  mine.set_item(o + 2, static_cast<double>(s.peak_in_flight()));
  mine.set_item(o + 3, static_cast<double>(s.sent_bytes()) / static_cast<double>(a.iters + 1));
  mine.set_item(o + 4, analytic);
  const AllocatorStats mem = Allocator::instance().stats();
  mine.set_item(o + 5, static_cast<double>(mem.peak_bytes - mem.live_bytes));
  world.all_reduce(mine);
  if (r.rank != 0) return;
  const double Pd = static_cast<double>(P), md = static_cast<double>(m), vd = static_cast<double>(v);
  const double formula = (Pd - 1) / (vd * md + Pd - 1);
  fmt::print(
      "moecore bench pipeline: {} ranks, PP={} (v={} virtual stages per rank{}), TP={}, DP={}, {} micro-batches of "
      "{}, {} layers H={} S={}, {}\n",
      r.world, P, v, v > 1 ? fmt::format(", groups of {}", group) : "", cfg.tensor_model_parallel_size, dp, m,
      cfg.micro_batch_size, cfg.num_layers, cfg.hidden_size, cfg.seq_length, a.dtype);
  fmt::print("  step {:.4f} s (median {:.4f} s); Megatron's bubble {} = {:.3f}\n", r.step_s, r.step_median_s,
             v > 1 ? "(P-1)/(v*m+P-1)" : "(P-1)/(m+P-1)", formula);
  fmt::print("  {:>5} {:>5} {:>9} {:>22} {:>18} {:>14} {:>14} {:>7}\n", "rank", "stage", "bubble",
             "peak in flight (expect)", "activation peak MiB", "sent MiB/step", "analytic MiB", "ratio");
  const double mib = 1024.0 * 1024.0;
  double bubble_sum = 0;
  for (int64_t k = 0; k < world.size(); k++) {
    const int64_t st = std::llround(mine.item(k * kFields));
    const int64_t warm = v == 1 ? P - st - 1 : (P - st - 1) * 2 + (v - 1) * group;
    const int64_t expect = std::min(warm + 1, m * v);
    const double sent = mine.item(k * kFields + 3), an = mine.item(k * kFields + 4);
    bubble_sum += mine.item(k * kFields + 1);
    fmt::print("  {:>5} {:>5} {:>9.3f} {:>13} ({:>6}) {:>18.1f} {:>14.3f} {:>14.3f} {:>7.3f}\n", k, st,
               mine.item(k * kFields + 1), std::llround(mine.item(k * kFields + 2)), expect,
               mine.item(k * kFields + 5) / mib, sent / mib, an / mib, an > 0 ? sent / an : 0.0);
  }
  fmt::print("pipeline bubble_measured={:.3f} bubble_formula={:.3f} (mean over ranks of the waiting share)\n",
             bubble_sum / static_cast<double>(world.size()), formula);
  print_split(r);
}
}  // namespace

BenchCommand add_pipeline_bench(CLI::App& bench) {
  TrainBenchArgs defaults;
  defaults.dtype = "f32";
  defaults.iters = 3;
  return add_training_bench(bench, "pipeline",
                            "Under mpirun: pipeline bubble vs Megatron's formula, activations in flight per stage, "
                            "P2P bytes vs the analytic count",
                            defaults, run_bench_pipeline);
}

}  // namespace moecore::cli
