// Timed training steps for the benchmarks that train a model (see train_run.h).
#include "moecore/cli/bench/train_run.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <sstream>

#include "moecore/cli/bench/bench_util.h"
#include "moecore/core/allocator.h"
#include "moecore/core/error.h"
#include "moecore/core/tensor.h"
#include "moecore/core/timer.h"
#include "moecore/device/runtime.h"
#include "moecore/kernels/gemm.h"

namespace moecore::cli {

TrainRun timed_train(const train::TrainConfig& cfg, int iters, std::unique_ptr<train::Trainer>& out,
                     std::optional<DType> peak) {
  comm::ProcessGroup::init(nullptr, nullptr);
  const comm::ProcessGroup world = comm::ProcessGroup::world();
  std::FILE* null = std::fopen("/dev/null", "w");
  out = std::make_unique<train::Trainer>(cfg, null, /*measure_peak=*/false, &world);
  train::Trainer& t = *out;
  // Installed for the warm-up too, so its events exist before the timed steps; reset after.
  std::unique_ptr<device::GpuProfiler> profile = device::profiler_for(t.device());
  if (profile) profile->begin_step();
  t.train_step();  // warm-up: primitives, allocator cache
  if (profile) profile->end_step(), profile->reset();
  for (const std::string& n : kPhaseTimers) t.timers().elapsed(n, /*reset=*/true);
  Allocator::instance().reset_peak();
  device::device_reset_peak(t.device());
  comm::comm_counters().clear();
  TrainRun r;
  std::vector<double> steps;
  GemmShapeTally shapes;  // the timed steps' GEMMs by shape (not the peak's)
  for (int i = 0; i <= iters; i++) {
    if (peak) {
      world.barrier();
      r.peak_samples.push_back(gemm_peak_sample(*peak, t.device()));
    }
    if (i == iters) break;
    world.barrier();
    const kernels::GemmStats g0 = kernels::gemm_stats();
    shapes.begin();
    const Stopwatch timer;
    if (profile) profile->begin_step();
    t.train_step(/*read_norm=*/false);  // as the train loop between log lines: the norm stays on the GPU
    if (profile) profile->end_step();
    device::synchronize(t.device());  // the step's queued GPU work (the optimizer's last kernels)
    t.settle_norms();                 // the log line's read, outside the profiled step
    world.barrier();
    steps.push_back(timer.seconds());
    const kernels::GemmStats g1 = kernels::gemm_stats();
    r.gemm_s += (g1.seconds - g0.seconds) / iters;
    r.gemm_flops += (g1.flops - g0.flops) / iters;
    shapes.end();
    for (const std::string& n : kPhaseTimers) r.timer_s[n] += t.timers().elapsed(n, /*reset=*/true) / iters;
  }
  r.gemm_shapes = shapes.shapes();
  for (double s : steps) r.step_s += s / iters;
  r.step_median_s = median(steps);
  r.steps_s = steps;
  if (profile) r.gpu = profile->report(kSyncSitesShown);
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

std::vector<std::string> bench_model_flags(const TrainBenchArgs& a, const std::string& model) {
  MOE_CHECK(a.dtype == "f32" || a.dtype == "bf16", "--dtype must be f32 or bf16, got {}", a.dtype);
  std::vector<std::string> flags;
  // --model NAME: the preset is the model; of the bench's own flags (which would override the preset's, e.g. GQA
  // under MLA) only the batch shape and the vocabulary stay.
  const bool preset = std::find(a.train_flags.begin(), a.train_flags.end(), "--model") != a.train_flags.end();
  std::istringstream words(model);
  bool keep = !preset;
  for (std::string w; words >> w;) {
    if (preset && w.rfind("--", 0) == 0)
      keep = w == "--seq-length" || w == "--micro-batch-size" || w == "--global-batch-size" || w == "--vocab-size";
    if (keep) flags.push_back(w);
  }
  if (a.dtype == "bf16") flags.push_back("--bf16");
  flags.insert(flags.end(), {"--mock-data", "--train-iters", std::to_string(a.iters + 1), "--lr", "1e-4",
                             "--eval-iters", "0", "--log-interval", "1000000"});
  return train::override_flags(flags, a.train_flags);
}

void print_split(const TrainRun& r) {
  fmt::print("  step {:.3f} s = compute {:.3f} s + exposed communication {:.3f} s ({:.1f}%; slowest rank {:.3f} s)\n",
             r.step_s, r.step_s - r.exposed_s, r.exposed_s, 100.0 * r.exposed_s / r.step_s, r.exposed_max_s);
  // Where rank 0 waited: per collective and group, the time blocked in Work::wait per step (what the overlap
  // flags --overlap-grad-reduce, --overlap-param-gather and --delay-wgrad-compute hide shows up here).
  std::vector<std::pair<double, std::string>> rows;
  const double iters = static_cast<double>(std::max<size_t>(1, r.steps_s.size()));
  for (const auto& [k, c] : r.counters)
    if (c.calls > 0)
      rows.push_back(
          {c.blocked_seconds / iters, fmt::format("{} ({:.0f} calls)", k, static_cast<double>(c.calls) / iters)});
  std::sort(rows.rbegin(), rows.rend());
  fmt::print("  exposed communication per step by collective (rank 0):");
  for (const auto& [s, name] : rows) fmt::print(" {} {:.4f} s;", name, s);
  fmt::print("\n");
}

BenchCommand add_training_bench(CLI::App& bench, const std::string& name, const std::string& description,
                                const TrainBenchArgs& defaults, void (*run)(const TrainBenchArgs&)) {
  auto a = std::make_shared<TrainBenchArgs>(defaults);
  CLI::App* cmd = bench.add_subcommand(name, description);
  cmd->add_option("--dtype", a->dtype, "f32 or bf16")->check(CLI::IsMember({"f32", "bf16"}))->capture_default_str();
  cmd->add_option("--iters", a->iters, "Timed steps")->check(CLI::Range(1, 1000))->capture_default_str();
  if (defaults.repeats > 0)
    cmd->add_option("--repeats", a->repeats, "Whole runs (rates and timed steps), the median of them reported")
        ->check(CLI::Range(1, 99))
        ->capture_default_str();
  cmd->allow_extras();
  return {cmd, [a, cmd, run] {
            a->train_flags = cmd->remaining();
            run(*a);
          }};
}

}  // namespace moecore::cli
