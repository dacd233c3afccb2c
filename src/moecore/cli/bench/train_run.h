// What the benchmarks that train a model share (bench train, comm, checkpoint): their arguments, the model flags
// under the user's overrides, and timed training steps with communication counters. Not a benchmark itself.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "moecore/cli/bench.h"
#include "moecore/comm/process_group.h"
#include "moecore/core/dtype.h"
#include "moecore/device/gpu_profile.h"
#include "moecore/kernels/gemm.h"
#include "moecore/train/trainer.h"

namespace moecore::cli {

struct TrainBenchArgs {
  std::string dtype = "bf16";
  int iters = 4;
  // Whole runs repeated (each: rates, timed steps, rates again), for a benchmark that reports the median of its
  // repeats; 0 where the benchmark offers no --repeats.
  int repeats = 0;
  std::vector<std::string> train_flags;  // `moecore train` flags overriding the benchmark's model
};

// The level-2 timers bench train reads for its phase table: the attention kernels, the token permutation copies,
// the optimizer step (Megatron's "optimizer": clipping and the update).
// The CPU kernels' own phase timers (TimerScope at level 2 in kernels/cpu and the router), with their labels. The
// router's includes its small gate GEMM, which the GEMM phase counts too.
inline const std::vector<std::pair<std::string, std::string>> kCpuKernelPhases = {
    {"norm", "norms (RMSNorm / LayerNorm)"},
    {"activation", "activations (SwiGLU, ...)"},
    {"moe-router", "router (scores, top-k, aux losses)"},
    {"loss", "cross-entropy"},
    {"rope", "RoPE"},
    {"dropout", "dropout"},
    {"embedding", "embedding"},
    {"weight-cast", "bf16 weight copies and packing"}};
inline const std::vector<std::string> kPhaseTimers = [] {
  std::vector<std::string> n = {"attention-core", "moe-permute", "optimizer"};
  for (const auto& [name, label] : kCpuKernelPhases) n.push_back(name);
  return n;
}();

// The host synchronisation sites bench train names on a GPU (the most frequent first).
constexpr size_t kSyncSitesShown = 8;
// The GEMM shapes bench train lists on the CPU (the most time first).
constexpr size_t kGemmShapesShown = 8;

struct TrainRun {
  double step_s = 0, step_median_s = 0, exposed_s = 0, exposed_max_s = 0;
  std::vector<double> steps_s;        // each timed step's seconds, in order
  double gemm_s = 0, gemm_flops = 0;  // per step: time inside oneDNN matmuls and their FLOPs
  std::vector<double> peak_samples;   // GEMM GFLOP/s measured between the timed steps (when asked)
  int64_t world = 1, rank = 0;
  std::map<std::string, comm::CommCounter> counters;  // of the timed steps only
  std::map<std::string, double> timer_s;              // per step: kPhaseTimers (with --timing-log-level 2)
  // Per step, by primitive shape (CPU): the timed steps' GEMMs, the most time first.
  std::vector<kernels::GemmShapeStats> gemm_shapes;
  // On a GPU: the step by phase from CUDA events and the host synchronisations by call site (the host timers above
  // measure only the launches there).
  std::optional<device::GpuProfileReport> gpu;
};

// Trains `cfg` over the MPI world (one rank without mpirun): one warm-up step, then `iters` timed steps with
// the communication counters cleared in between. With `peak`, a reference GEMM rate of that dtype is sampled on
// every rank before each timed step and after the last, so the peak an MFU divides by is measured in the same
// conditions as the steps (on a shared machine both swing together). On a GPU the timed steps are profiled
// (cuda/gpu_profile.h: events at each change of phase, read after the step's one synchronisation).
TrainRun timed_train(const train::TrainConfig& cfg, int iters, std::unique_ptr<train::Trainer>& out,
                     std::optional<DType> peak = std::nullopt);

// The benchmark's model flags (`model`: flags and values separated by spaces) and run flags (mock data, dtype,
// iterations, no logging), overridden by the user's.
std::vector<std::string> bench_model_flags(const TrainBenchArgs& a, const std::string& model);

// "step = compute + exposed communication" for a run over several ranks.
void print_split(const TrainRun& r);

// The subcommand of a benchmark that trains: --dtype and --iters (defaults from `defaults`); any other arguments
// are `moecore train` flags, checked there, that reach `run` in train_flags.
BenchCommand add_training_bench(CLI::App& bench, const std::string& name, const std::string& description,
                                const TrainBenchArgs& defaults, void (*run)(const TrainBenchArgs&));

}  // namespace moecore::cli
