// `moecore bench comm`: communication of a training step under mpirun (a small MoE model by default, routing
// forced uniform): for every group and collective, calls and bytes received per rank per step, the analytic
// minimum for the layout per group and the ratio; step time split into compute and exposed communication. With
// --device cuda first each collective alone on GPU tensors over the job's GPU transport (NCCL with one GPU per
// rank): time, algorithm bandwidth and bus bandwidth (nccl-tests' definition: the bytes a bandwidth-optimal
// algorithm moves through each rank's link, over the time), so the figures compare with the link's peak.
#include <fmt/format.h>

#include <algorithm>
#include <functional>

#include "moecore/cli/bench/benches.h"
#include "moecore/cli/bench/comm_dispatch.h"
#include "moecore/cli/bench/train_run.h"
#include "moecore/comm/gpu_transport.h"
#include "moecore/core/tensor.h"
#include "moecore/core/timer.h"
#include "moecore/device/runtime.h"
#include "moecore/train/config/start_config.h"

namespace moecore::cli {

namespace {
// One collective's bus factor (nccl-tests): the analytic minimum each rank's link carries, as a multiple of the
// operation's size S (the whole buffer: all-reduce's, all-gather's output, reduce-scatter's input, all-to-all's
// input): all-reduce 2(P−1)/P·S; all-gather, reduce-scatter, all-to-all (P−1)/P·S; broadcast and a ring step S.
struct CollectiveCase {
  const char* name;
  double bus_factor;
  std::function<void(Tensor&, Tensor&)> run;
};

void bench_gpu_collectives(const comm::ProcessGroup& world, Device d, int iters) {
  const int64_t P = world.size(), me = world.rank();
  std::vector<int64_t> all;
  for (int64_t r = 0; r < P; r++) all.push_back(r);
  comm::ProcessGroup g = world.split({all});  // its NCCL communicator made here (NCCL transport)
  g.set_name("bench");
  const double p = static_cast<double>(P), ring = P > 1 ? (p - 1) / p : 0.0;
  const std::vector<int64_t> even(static_cast<size_t>(P), 0);
  std::vector<CollectiveCase> cases = {
      {"all_reduce", 2 * ring, [&](Tensor& a, Tensor&) { g.all_reduce(a); }},
      {"all_gather", ring, [&](Tensor& a, Tensor& b) { g.all_gather(a.slice(0, a.dim(0) / P), b); }},
      {"reduce_scatter", ring,
       [&](Tensor& a, Tensor& b) {
         Tensor o = b.slice(0, a.dim(0) / P);
         g.reduce_scatter(a, o);
       }},
      {"all_to_all_v", ring,
       [&](Tensor& a, Tensor& b) {
         const std::vector<int64_t> rows(static_cast<size_t>(P), a.dim(0) / P);
         g.all_to_all_v(a, rows, b, rows);
       }},
      {"broadcast", 1.0, [&](Tensor& a, Tensor&) { g.broadcast(a, 0); }},
      {"send_recv_ring", P > 1 ? 1.0 : 0.0,
       [&](Tensor& a, Tensor& b) { g.send_recv(a, (me + 1) % P, b, (me + P - 1) % P, 0); }}};
  if (me == 0) {
    fmt::print("moecore bench comm: collectives on GPU tensors, {} ranks, {} ({})\n", P,
               comm::gpu_transport() == comm::GpuTransport::Nccl ? "NCCL" : "host-staged MPI",
               device::describe_device(d));
    fmt::print(
        "  per operation and size: time per call, algbw = size / time, busbw = bus_mib / time (bus_mib: the analytic "
        "minimum through each rank's link)\n");
  }
  for (const int64_t mib : {1, 16, 256}) {
    const int64_t rows = std::max<int64_t>(P, mib * 1024 * 1024 / 4 / 256 / P * P);  // [rows, 256] f32
    Tensor a = Tensor::zeros({rows, 256}, DType::F32, d), b = Tensor::zeros({rows, 256}, DType::F32, d);
    const double bytes = static_cast<double>(a.nbytes());
    for (auto& c : cases) {
      for (int i = 0; i < 2; i++) c.run(a, b);  // warm-up: communicators connect, buffers register
      device::synchronize();
      world.barrier();
      const double t0 = now_seconds();
      for (int i = 0; i < iters; i++) c.run(a, b);
      device::synchronize();  // the current stream waited on every operation's event
      const double s = (now_seconds() - t0) / iters;
      if (me == 0)
        fmt::print(
            "comm_gpu op={:<22} mib={:>6.1f} time_us={:>10.1f} algbw={:>8.2f} busbw={:>8.2f} bus_mib={:>10.2f}\n",
            c.name, bytes / 1048576.0, s * 1e6, bytes / s / 1e9, bytes * c.bus_factor / s / 1e9,
            bytes * c.bus_factor / 1048576.0);
    }
  }
}

void print_comm_table(const train::TrainConfig& cfg, const TrainBenchArgs& a, const TrainRun& r,
                      const std::map<std::string, double>& analytic, std::map<std::string, double>& measured);

void run_bench_comm(const TrainBenchArgs& a) {
  const train::TrainConfig cfg = train::parse_train_config(bench_model_flags(
      a,
      "--normalization RMSNorm --position-embedding-type rope "
      "--num-layers 2 --hidden-size 256 --num-attention-heads 8 --swiglu --disable-bias-linear --num-experts 8 "
      "--moe-router-topk 2 --moe-ffn-hidden-size 256 --moe-router-force-load-balancing --seq-length 256 "
      "--micro-batch-size 2 --global-batch-size 8 --vocab-size 4096"));
  if (cfg.device.rfind("cuda", 0) == 0) {  // each collective alone on the GPU transport the job uses
    comm::ProcessGroup::init(nullptr, nullptr);
    const comm::ProcessGroup world = comm::ProcessGroup::world();
    const Device d = comm::place_ranks_on_gpus(cfg.device, "bench comm", world.comm(), nullptr);
    bench_gpu_collectives(world, d, std::max(a.iters, 5));
  }
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
  if (r.rank == 0) print_comm_table(cfg, a, r, analytic, measured);
  if (r.world > 1 && cfg.num_experts % r.world == 0) bench_dispatch_bytes(cfg, a.dtype == "bf16");
}

void print_comm_table(const train::TrainConfig& cfg, const TrainBenchArgs& a, const TrainRun& r,
                      const std::map<std::string, double>& analytic, std::map<std::string, double>& measured) {
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
