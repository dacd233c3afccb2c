// `moecore bench plan`: the step-time model of `moecore plan --plan-gpu` (train/plan/step_time.h) against moecore's
// own step on this machine. The machine's rates are measured in the same run on every rank at once (a GEMM sample
// as `bench gemm` takes it, the attention kernels at the model's shape as `bench attention` runs them, a streaming
// copy, an all-reduce over the world as `bench comm` moves bytes); the model predicts `bench train`'s step under the
// layout the flags give; the measured step is the median of the timed steps. Prints both and their ratio.
#include <fmt/format.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <vector>

#include "moecore/cli/bench/bench_util.h"
#include "moecore/cli/bench/benches.h"
#include "moecore/cli/bench/train_run.h"
#include "moecore/comm/process_group.h"
#include "moecore/core/cpu.h"
#include "moecore/core/error.h"
#include "moecore/core/timer.h"
#include "moecore/kernels/attention.h"
#include "moecore/kernels/cross_entropy.h"
#include "moecore/kernels/gemm.h"
#include "moecore/train/config/start_config.h"
#include "moecore/train/memory_plan.h"
#include "moecore/train/model_builder.h"
#include "moecore/train/plan/step_time.h"

namespace moecore::cli {

namespace {

// Seconds of one call of `f`: the median of `n` samples, each repeating `f` for at least 50 ms. The step is the
// median of its timed steps, so the rates are medians too (a moment when this rank had a core to itself does not
// stand for the step's rate); the 50 ms windows span several of the scheduler's time slices, so ranks that share
// cores (more ranks than cores, mpirun --oversubscribe) see their share of them, as they do during the step.
template <class F>
double median_of(int n, F f) {
  std::vector<double> t;
  for (int i = 0; i < n; i++) {
    const Stopwatch w;
    int64_t reps = 0;
    do {
      f();
      reps++;
    } while (w.seconds() < 0.05);
    t.push_back(w.seconds() / static_cast<double>(reps));
  }
  return median(t);
}

// The same for a collective: every rank must make the same calls, so each of the `n` samples times `reps` of them.
template <class F>
double median_of_calls(int n, int reps, F f) {
  std::vector<double> t;
  for (int i = 0; i < n; i++) {
    const Stopwatch w;
    for (int k = 0; k < reps; k++) f();
    t.push_back(w.seconds() / reps);
  }
  return median(t);
}

// The cores this process may run on (its affinity mask: what mpirun and the container give it).
int cores_here() {
  cpu_set_t set;
  CPU_ZERO(&set);
  return sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 1;
}

// This machine as the model's "GPU": each rank's share of it, measured with every rank busy at once.
train::plan::GpuSpec measure_machine(const train::TrainConfig& c, const train::PlanLayout& l, int64_t vocab) {
  const comm::ProcessGroup world = comm::ProcessGroup::world();
  train::plan::GpuSpec s;
  s.name = "cpu";
  s.description = "this machine's ranks";
  // bf16 operands as --bf16 training has them, from seeded f32 values.
  auto random = [](const Shape& shape, uint64_t seed) {
    Tensor t = Tensor::empty(shape, DType::F32);
    fill_random(t, seed, 1.0);
    return t.as_dtype(DType::BF16);
  };
  // The GEMM rate at the model's shape on this rank, not at a large square's: a micro-batch's tokens [S·B/CP, H]
  // times a weight [H, H/TP] (the attention projections'), bf16 as training runs it; the median of 7, every rank at
  // once. Small K and N run well below the large-shape peak, on a CPU as on a GPU.
  {
    const int64_t M = c.seq_length * c.micro_batch_size / l.cp, K = c.hidden_size, N = c.hidden_size / l.tp;
    const Tensor A = random({M, K}, 1), B = random({K, N}, 2);
    Tensor C = Tensor::empty({M, N}, DType::F32);
    kernels::gemm(A, false, B, false, C);  // the primitive
    world.barrier();
    const double g_s = median_of(5, [&] { kernels::gemm(A, false, B, false, C); });
    s.peak_bf16 = 2.0 * static_cast<double>(M * K * N) / g_s;
  }
  s.peak_fp8 = s.peak_bf16;
  s.gemm_bf16_efficiency = s.gemm_fp8_efficiency = 1;
  // Attention at the model's shape on this rank (S, B, heads / TP), bf16 tensors as --bf16 training runs them.
  const int64_t S = c.seq_length, B = c.micro_batch_size, D = c.kv_channels;
  const int64_t Nq = c.num_attention_heads / l.tp, Nkv = std::max<int64_t>(1, c.num_query_groups / l.tp);
  const Tensor q = random({S, B, Nq, D}, 3), k = random({S, B, Nkv, D}, 4), v = random({S, B, Nkv, D}, 5),
               dout = random({S, B, Nq, D}, 6);
  Tensor o = Tensor::empty(q.shape(), DType::BF16), lse = Tensor::empty({B, Nq, S}, DType::F32);
  Tensor dq = Tensor::zeros(q.shape(), DType::BF16), dk = Tensor::empty(k.shape(), DType::BF16),
         dv = Tensor::empty(v.shape(), DType::BF16);
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  world.barrier();
  const double fwd_s = median_of(5, [&] { kernels::attention_forward_bf16(q, k, v, scale, o, lse); });
  const double bwd_s =
      median_of(5, [&] { kernels::attention_backward_bf16(dout, q, k, v, o, lse, scale, dq, dk, dv); });
  const double fwd_flops = 4.0 * static_cast<double>(S) * static_cast<double>(S) / 2 * static_cast<double>(D * Nq * B);
  s.attention_fwd_efficiency = fwd_flops / fwd_s / s.peak_bf16;
  s.attention_bwd_efficiency = 2.5 * fwd_flops / bwd_s / s.peak_bf16;
  // The cross-entropy over this rank's logits [S·B/CP, V/TP] (bf16, as the bf16 output layer writes them) with
  // the kernels training calls: without TP the fused forward and backward (one pass), with TP the vocabulary-
  // parallel forward (its all-reduces of [tokens] statistics left out: the model prices those calls) and the
  // backward.
  {
    const int64_t rows = c.seq_length * c.micro_batch_size / l.cp, V = vocab / l.tp;
    Tensor logits = random({rows, V}, 9), targets = Tensor::empty({rows}, DType::I64);
    for (int64_t t = 0; t < rows; t++) targets.data<int64_t>()[t] = (t * 7919) % V;
    const DType sd = kernels::cross_entropy_stats_dtype(DType::BF16);
    Tensor loss = Tensor::empty({rows}, sd), lse = Tensor::empty({rows}, sd), dloss = Tensor::empty({rows}, sd);
    for (int64_t t = 0; t < rows; t++) dloss.set_item(t, 1.0 / static_cast<double>(rows));
    world.barrier();
    if (l.tp == 1) {
      s.cross_entropy_fwd_seconds =
          median_of(3, [&] { kernels::cross_entropy_forward_backward(logits, targets, dloss, loss, lse); });
    } else {
      const kernels::ReduceFn none = [](Tensor&, bool) {};
      s.cross_entropy_fwd_seconds = median_of(
          3, [&] { kernels::cross_entropy_forward_vocab_parallel(logits, targets, 0, V * l.tp, none, loss, lse); });
      Tensor grad = Tensor::empty({rows, V}, DType::BF16);
      s.cross_entropy_bwd_seconds =
          median_of(3, [&] { kernels::cross_entropy_backward(dloss, logits, targets, lse, grad, 0); });
    }
  }
  // The output layer's GEMMs at their shape, bf16 as training runs them: logits = x·Wᵀ, then dx = dlogits·W and
  // dW = dlogitsᵀ·x. A [tokens, V] product runs at its own rate, not the projections' (long N; K = V for dx).
  {
    const int64_t M = c.seq_length * c.micro_batch_size / l.cp, H = c.hidden_size, V = vocab / l.tp;
    const Tensor x = random({M, H}, 10), w = random({V, H}, 11), dl = random({M, V}, 12);
    Tensor y = Tensor::empty({M, V}, DType::F32), dx = Tensor::empty({M, H}, DType::F32),
           dw = Tensor::empty({V, H}, DType::F32);
    world.barrier();
    s.output_layer_fwd_seconds = median_of(3, [&] { kernels::gemm(x, false, w, true, y); });
    s.output_layer_bwd_seconds = median_of(3, [&] {
      kernels::gemm(dl, false, w, false, dx);
      kernels::gemm(dl, true, x, false, dw);
    });
  }
  // Streaming copy: 64 MiB read and written.
  std::vector<char> a(64 << 20, 1), b(64 << 20);
  world.barrier();
  const double copy_s = median_of(3, [&] { std::memcpy(b.data(), a.data(), a.size()); });
  s.hbm_bandwidth = 2.0 * static_cast<double>(a.size()) / copy_s;
  s.hbm_efficiency = 1;
  // MPI over the world (every group of this run is inside it) as latency plus bytes over a bus bandwidth: the
  // latency from a one-element all-reduce, the bus bandwidth from a 128 MiB one (MPI's host copies at the memory's
  // rate, the size of a layer's gradient bucket rather than one that stays in cache). With more ranks than cores
  // both include the waits for a descheduled peer.
  s.nccl_busbw_nvlink = s.nccl_busbw_network = s.alltoall_busbw_network = 1e12;
  if (world.size() > 1) {
    Tensor one = Tensor::zeros({1}, DType::F32);
    world.barrier();
    const double lat = median_of_calls(5, 50, [&] { world.all_reduce(one); });
    Tensor t = Tensor::zeros({32 << 20}, DType::F32);
    world.barrier();
    const double ar_s = median_of_calls(3, 1, [&] { world.all_reduce(t); });
    const double n = static_cast<double>(world.size());
    s.nccl_busbw_nvlink = s.nccl_busbw_network = s.alltoall_busbw_network =
        2 * (n - 1) / n * static_cast<double>(t.numel()) * 4 / std::max(1e-9, ar_s - lat);
    s.collective_latency_nvlink = s.collective_latency_network = lat;
  }
  s.gpus_per_nvlink_domain = static_cast<int>(world.size());
  s.network_bandwidth = s.nvlink_bandwidth = s.nccl_busbw_nvlink;
  s.kernel_launch_seconds = 0;
  return s;
}

// The rates measured before and after the timed steps, combined as the steps would see them: each rate the harmonic
// mean of the two (the mean of its seconds per unit of work), each latency the mean. Other work on a shared machine
// comes and goes; bracketing the steps makes the rates see about the load the steps saw.
train::plan::GpuSpec bracket(const train::plan::GpuSpec& a, const train::plan::GpuSpec& b) {
  auto h = [](double x, double y) { return x > 0 && y > 0 ? 2 / (1 / x + 1 / y) : std::max(x, y); };
  train::plan::GpuSpec s = a;
  s.peak_bf16 = s.peak_fp8 = h(a.peak_bf16, b.peak_bf16);
  s.attention_fwd_efficiency =
      h(a.attention_fwd_efficiency * a.peak_bf16, b.attention_fwd_efficiency * b.peak_bf16) / s.peak_bf16;
  s.attention_bwd_efficiency =
      h(a.attention_bwd_efficiency * a.peak_bf16, b.attention_bwd_efficiency * b.peak_bf16) / s.peak_bf16;
  s.hbm_bandwidth = h(a.hbm_bandwidth, b.hbm_bandwidth);
  s.cross_entropy_fwd_seconds = (a.cross_entropy_fwd_seconds + b.cross_entropy_fwd_seconds) / 2;
  s.cross_entropy_bwd_seconds = (a.cross_entropy_bwd_seconds + b.cross_entropy_bwd_seconds) / 2;
  s.output_layer_fwd_seconds = (a.output_layer_fwd_seconds + b.output_layer_fwd_seconds) / 2;
  s.output_layer_bwd_seconds = (a.output_layer_bwd_seconds + b.output_layer_bwd_seconds) / 2;
  s.nccl_busbw_nvlink = s.nccl_busbw_network = s.alltoall_busbw_network = h(a.nccl_busbw_nvlink, b.nccl_busbw_nvlink);
  s.network_bandwidth = s.nvlink_bandwidth = s.nccl_busbw_nvlink;
  s.collective_latency_nvlink = s.collective_latency_network =
      (a.collective_latency_nvlink + b.collective_latency_nvlink) / 2;
  return s;
}

// One run: the rates before, the timed steps, the rates after; the model's prediction under those rates.
struct PlanRun {
  TrainRun steps;
  train::plan::GpuSpec machine;
  train::plan::StepPrediction prediction;
  double ratio = 0;
  // How much the machine's speed moved during the run, the largest over the ranks of: the GEMM rate and the copy
  // bandwidth before against after the steps, and the slowest timed step against the fastest (max / min, 1 when
  // steady). Other work coming and going on a shared machine shows here.
  double swing = 1;
};
PlanRun plan_run(const train::TrainConfig& cfg, const train::PlanLayout& l, int64_t vocab, int iters) {
  PlanRun p;
  const train::plan::GpuSpec before = measure_machine(cfg, l, vocab);
  std::unique_ptr<train::Trainer> t;
  p.steps = timed_train(cfg, iters, t, std::nullopt);
  t.reset();
  const train::plan::GpuSpec after = measure_machine(cfg, l, vocab);
  p.machine = bracket(before, after);
  p.prediction = train::plan::predict_step(cfg, vocab, l, p.machine);
  p.ratio = p.prediction.step_seconds / p.steps.step_median_s;
  auto swing = [](double x, double y) { return std::max(x, y) / std::max(1e-30, std::min(x, y)); };
  const auto [lo, hi] = std::minmax_element(p.steps.steps_s.begin(), p.steps.steps_s.end());
  Tensor e = Tensor::empty({1}, DType::F64);
  e.set_item(0, std::max({swing(before.peak_bf16, after.peak_bf16), swing(before.hbm_bandwidth, after.hbm_bandwidth),
                          swing(*lo, *hi)}));
  const comm::ProcessGroup world = comm::ProcessGroup::world();
  if (world.size() > 1) world.all_reduce(e, comm::ReduceOp::Max);
  p.swing = e.item(0);
  return p;
}

// A run is steady when the machine's speed moved by at most kUnsteadyPeak (bench_util's bound for the peak
// samples) during it: only steady runs are compared with the model.
bool steady(const PlanRun& p) {
  return p.swing <= kernels::kUnsteadyPeak;
}

// The largest of `x` over the ranks (so that every rank takes the same decision).
double max_over_ranks(double x) {
  const comm::ProcessGroup world = comm::ProcessGroup::world();
  Tensor e = Tensor::empty({1}, DType::F64);
  e.set_item(0, x);
  if (world.size() > 1) world.all_reduce(e, comm::ReduceOp::Max);
  return e.item(0);
}

void run_bench_plan(const TrainBenchArgs& a) {
  MOE_CHECK(a.dtype == "bf16", "moecore bench plan: --dtype {}: the step-time model plans bf16 runs; use --dtype bf16",
            a.dtype);
  // bench train's model (cli/bench/train.cpp) under the user's flags.
  const train::TrainConfig cfg = train::parse_train_config(bench_model_flags(
      a,
      "--normalization RMSNorm --position-embedding-type rope --num-layers 4 --hidden-size 1024 "
      "--num-attention-heads 16 --group-query-attention --num-query-groups 4 --swiglu --disable-bias-linear "
      "--num-experts 8 --moe-router-topk 2 --moe-ffn-hidden-size 1024 --moe-aux-loss-coeff 1e-2 --seq-length 256 "
      "--micro-batch-size 4 --global-batch-size 8 --vocab-size 32000"));
  comm::ProcessGroup::init(nullptr, nullptr);
  const train::PlanLayout l = train::PlanLayout::from(cfg, comm::ProcessGroup::world().size());
  const int64_t vocab = train::build_vocabulary(cfg).padded;
  // Whole runs repeated until `repeats` of them are steady (at most twice that many runs, none started after 40
  // s); the steady run of median ratio is reported. On a shared machine one run's ratio moves with the other work:
  // a run during which the machine's speed moved (rates before against after, step against step) compares the
  // model with a moment of it, so it is printed but not counted.
  const int want = std::max(1, a.repeats);
  const Stopwatch clock;
  std::vector<PlanRun> runs;
  std::vector<size_t> kept;
  for (int i = 0; i < 2 * want && std::ssize(kept) < want; i++) {
    if (i > 0 && max_over_ranks(clock.seconds()) > 40) break;
    runs.push_back(plan_run(cfg, l, vocab, a.iters));
    const PlanRun& p = runs.back();
    if (steady(p)) kept.push_back(runs.size() - 1);
    if (p.steps.rank == 0 && a.repeats > 1)
      fmt::print("plan repeat {}: predicted_s={:.4f} measured_s={:.4f} ratio={:.3f} swing={:.2f} ({})\n", i + 1,
                 p.prediction.step_seconds, p.steps.step_median_s, p.ratio, p.swing,
                 steady(p) ? "steady" : "unsteady: not counted");
  }
  // Enough steady runs: all of them with one repeat asked for, else at least two.
  const bool enough = std::ssize(kept) >= std::min(want, 2);
  std::vector<size_t> order = enough ? kept : std::vector<size_t>{};
  if (!enough)
    for (size_t i = 0; i < runs.size(); i++) order.push_back(i);
  std::sort(order.begin(), order.end(), [&](size_t x, size_t y) { return runs[x].ratio < runs[y].ratio; });
  const PlanRun& m = runs[order[order.size() / 2]];
  const TrainRun& r = m.steps;
  const train::plan::GpuSpec& machine = m.machine;
  const train::plan::StepPrediction& p = m.prediction;
  if (r.rank != 0) return;
  fmt::print(
      "moecore bench plan: {} rank(s), TP {} PP {} EP {} DP {}; measured rates per rank: GEMM {:.1f} GFLOP/s, "
      "attention forward {:.1f} / backward {:.1f} GFLOP/s, copy {:.2f} GB/s, all-reduce bus {:.2f} GB/s, collective "
      "latency {:.1f} us; {} rank(s) x {} thread(s) on {} core(s), each rank bound to {}\n",
      r.world, l.tp, l.pp, l.ep, l.dp, machine.peak_bf16 / 1e9,
      machine.attention_fwd_efficiency * machine.peak_bf16 / 1e9,
      machine.attention_bwd_efficiency * machine.peak_bf16 / 1e9, machine.hbm_bandwidth / 1e9,
      r.world > 1 ? machine.nccl_busbw_nvlink / 1e9 : 0.0, 1e6 * machine.collective_latency_nvlink, r.world,
      num_threads(), sysconf(_SC_NPROCESSORS_ONLN), cores_here());
  fmt::print("{}", train::plan::describe(p, machine, r.world));
  if (r.world > 1) print_split(r);
  fmt::print("plan predicted_s={:.4f} measured_s={:.4f} ratio={:.3f} within_20_percent={}{}\n", p.step_seconds,
             r.step_median_s, m.ratio,
             !enough                        ? "unsteady"
             : std::abs(m.ratio - 1) <= 0.2 ? "yes"
                                            : "no",
             !enough ? fmt::format(" (the machine's speed moved by more than {:.2f}x in {} of {} runs: not compared)",
                                   kernels::kUnsteadyPeak, runs.size() - kept.size(), runs.size())
             : order.size() > 1 ? fmt::format(" (the median of {} steady runs of {})", order.size(), runs.size())
                                : std::string());
}

}  // namespace

BenchCommand add_plan_bench(CLI::App& bench) {
  return add_training_bench(bench, "plan",
                            "the step-time model of moecore plan --plan-gpu against bench train's measured step",
                            TrainBenchArgs{.repeats = 1, .train_flags = {}}, run_bench_plan);
}

}  // namespace moecore::cli
