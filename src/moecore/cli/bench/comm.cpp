// `moecore bench comm`: communication of a training step under mpirun (a small MoE model by default, routing
// forced uniform): for every group and collective, calls and bytes received per rank per step, the analytic
// minimum for the layout per group and the ratio; step time split into compute and exposed communication.
#include <fmt/format.h>

#include "moecore/cli/bench/benches.h"
#include "moecore/cli/bench/train_run.h"
#include "moecore/core/tensor.h"
#include "moecore/train/config/start_config.h"

namespace moecore::cli {

namespace {
void run_bench_comm(const TrainBenchArgs& a) {
  const train::TrainConfig cfg = train::parse_train_config(bench_model_flags(
      a,
      "--normalization RMSNorm --position-embedding-type rope "
      "--num-layers 2 --hidden-size 256 --num-attention-heads 8 --swiglu --disable-bias-linear --num-experts 8 "
      "--moe-router-topk 2 --moe-ffn-hidden-size 256 --moe-router-force-load-balancing --seq-length 256 "
      "--micro-batch-size 2 --global-batch-size 8 --vocab-size 4096"));
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
  fmt::print(
      "moecore bench comm: {} ranks, TP={} EP={} ETP={} (DP and EDP fill the rest), {} dispatcher, {}, "
      "{} layers H={} S={} global batch {} x {}\n",
      r.world, cfg.tensor_model_parallel_size, cfg.expert_model_parallel_size, cfg.expert_tensor_parallel_size,
      cfg.moe_token_dispatcher_type, a.dtype, cfg.num_layers, cfg.hidden_size, cfg.seq_length, cfg.global_batch_size,
      cfg.micro_batch_size);
  fmt::print("  {:<28} {:>7} {:>14} {:>14} {:>10}\n", "group:collective (rank 0)", "calls", "payload MiB",
             "received MiB", "blocked s");
  const double mib = 1024.0 * 1024.0;
  for (const auto& [k, c] : r.counters)
    fmt::print("  {:<28} {:>7.1f} {:>14.3f} {:>14.3f} {:>10.4f}\n", k, static_cast<double>(c.calls) / a.iters,
               c.payload_bytes / a.iters / mib, c.received_bytes / a.iters / mib, c.blocked_seconds / a.iters);
  fmt::print(
      "  per group, per step, mean over ranks: received vs analytic minimum (uniform routing, "
      "bandwidth-optimal collectives)\n");
  for (const auto& [g, bytes] : analytic) {
    const double m = measured.count(g) ? measured[g] : 0.0;
    fmt::print("comm group={} received_mib={:.3f} analytic_mib={:.3f} ratio={:.3f}\n", g, m / mib, bytes / mib,
               bytes > 0 ? m / bytes : 0.0);
  }
  for (const auto& [g, m] : measured)
    if (!analytic.count(g))
      fmt::print("  {}: {:.4f} MiB of metadata and statistics (no analytic bulk term)\n", g, m / mib);
  print_split(r);
}
}  // namespace

BenchCommand add_comm_bench(CLI::App& bench) {
  TrainBenchArgs defaults;
  defaults.dtype = "f32";
  defaults.iters = 3;
  return add_training_bench(
      bench, "comm",
      "Under mpirun: bytes per collective vs the layout's analytic minimum; compute vs exposed communication", defaults,
      run_bench_comm);
}

}  // namespace moecore::cli
