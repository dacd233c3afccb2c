// `moecore bench context`: attention over context parallelism under mpirun (the world is the CP group, C ranks).
//   - attention FLOPs per rank, max/min over ranks, with the load-balanced split (chunks r and 2C−1−r) and with the
//     naive contiguous split (rank r holds rows r·S/C ..), counted exactly from the causal mask;
//   - per-rank attention activation memory (q, k, v, o, lse saved for backward, plus the ring's transient buffers)
//     against C = 1;
//   - the ring's exposed communication: forward+backward time with the K/V ring (overlapped) against the same
//     blocks computed with no communication, and the time blocked in waits on the CP group;
//   - achieved attention GFLOP/s against the GEMM peak sampled in the same run (cli/bench/bench_util.h).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <memory>

#include "moecore/cli/bench/bench_util.h"
#include "moecore/cli/bench/benches.h"
#include "moecore/comm/process_group.h"
#include "moecore/core/timer.h"
#include "moecore/kernels/attention.h"
#include "moecore/nn/context_attention.h"

namespace moecore::cli {

namespace {

struct ContextBenchArgs {
  int64_t seq = 4096, batch = 1, heads = 8, kv_heads = 8, head_dim = 64;
  int iters = 3;
  std::string comm_type = "p2p";
  std::string dtype = "f32";  // bf16: operands rounded as --bf16 training rounds them (cp.bf16)
};

// Visible (query, key) pairs of rows [r0, r0+n) under the causal mask.
double pairs(int64_t r0, int64_t n) {
  return static_cast<double>(n) * static_cast<double>(r0) + static_cast<double>(n) * static_cast<double>(n + 1) / 2;
}

Tensor rand_rows(int64_t rows, const ContextBenchArgs& a, int64_t heads, uint64_t stream) {
  Tensor t = Tensor::empty({rows, a.batch, heads, a.head_dim}, DType::F32);
  fill_random(t, stream, 1.0);
  return t;
}

// The blocks this rank computes in the ring, without the ring: the same (query chunk, key chunk) pairs, on local
// data (the kernel's time does not depend on the values).
void blocks_only(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout, int64_t C, int64_t r,
                 double scale, bool bf16) {
  const int64_t sc = q.dim(0) / 2, mine[2] = {r, 2 * C - 1 - r};
  Tensor o = Tensor::zeros({sc, q.dim(1), q.dim(2), q.dim(3)}, DType::F32), dq = Tensor::zeros(o.shape(), DType::F32);
  Tensor lse = Tensor::zeros({q.dim(1), q.dim(2), sc}, DType::F32), po = Tensor::empty(o.shape(), DType::F32);
  Tensor pl = Tensor::empty(lse.shape(), DType::F32);
  Tensor dk = Tensor::empty({sc, k.dim(1), k.dim(2), k.dim(3)}, DType::F32), dv = Tensor::empty(dk.shape(), DType::F32);
  for (int pass = 0; pass < 2; pass++)
    for (int64_t src = 0; src < C; src++)
      for (int64_t i = 0; i < 2; i++)
        for (int64_t ck : {src, 2 * C - 1 - src}) {
          const int64_t cq = mine[i];
          if (ck > cq) continue;
          const Tensor qc = q.slice(i * sc, sc), kc = k.slice(i * sc, sc), vc = v.slice(i * sc, sc);
          if (pass == 0) {
            kernels::attention_block_forward(qc, kc, vc, cq * sc, ck * sc, scale, po, pl, nullptr, bf16);
            kernels::attention_merge(o, lse, po, pl);
          } else {
            kernels::attention_block_backward(dout.slice(i * sc, sc), qc, kc, vc, o, lse, cq * sc, ck * sc, scale, dq,
                                              dk, dv, nullptr, bf16);
          }
        }
}

void run_bench_context(const ContextBenchArgs& a) {
  comm::ProcessGroup::init(nullptr, nullptr);
  comm::ProcessGroup cpg = comm::ProcessGroup::world();
  cpg.set_name("cp");
  const int64_t C = cpg.size(), r = cpg.rank(), S = a.seq;
  MOE_CHECK(S % (2 * C) == 0, "--seq-length {} must divide into 2·C = {} chunks", S, 2 * C);
  MOE_CHECK(a.heads % a.kv_heads == 0, "--num-attention-heads {} must be a multiple of --num-query-groups {}", a.heads,
            a.kv_heads);
  MOE_CHECK(a.comm_type == "p2p" || a.comm_type == "a2a" || a.comm_type == "allgather",
            "--cp-comm-type {}: this benchmark runs p2p, a2a or allgather (a2a+p2p needs the trainer's groups)",
            a.comm_type);
  const int64_t sc = S / (2 * C);
  // FLOPs: per rank, both splits (exact pair counts; 4·D FLOPs per pair forward per head).
  double bal_max = 0, bal_min = 1e300, naive_max = 0, naive_min = 1e300;
  for (int64_t m = 0; m < C; m++) {
    const double bal = pairs(m * sc, sc) + pairs((2 * C - 1 - m) * sc, sc), naive = pairs(m * S / C, S / C);
    bal_max = std::max(bal_max, bal), bal_min = std::min(bal_min, bal);
    naive_max = std::max(naive_max, naive), naive_min = std::min(naive_min, naive);
  }
  const double head_flops = 4.0 * static_cast<double>(a.head_dim * a.batch * a.heads);
  // Memory per rank: q, o (Nq heads), k, v (Nkv heads) of 2·sc rows, lse; the ring's two K/V buffers and the
  // dK/dV buffers in flight.
  const double row_q = static_cast<double>(a.batch * a.heads * a.head_dim) * 4;
  const double row_kv = static_cast<double>(a.batch * a.kv_heads * a.head_dim) * 4;
  auto saved = [&](double rows) {
    return rows * (2 * row_q + 2 * row_kv + static_cast<double>(a.batch * a.heads) * 4);
  };
  const double rows = static_cast<double>(2 * sc), ring_transient = 2 * 2 * rows * row_kv + 3 * 2 * rows * row_kv;

  // Timing.
  nn::ContextParallel cp;
  cp.group = &cpg;
  cp.size = C;
  cp.rank = r;
  cp.comm_type = a.comm_type == "p2p"   ? nn::CpCommType::P2P
                 : a.comm_type == "a2a" ? nn::CpCommType::A2A
                                        : nn::CpCommType::AllGather;
  cp.bf16 = a.dtype == "bf16";
  const Tensor q = rand_rows(2 * sc, a, a.heads, 1 + r), k = rand_rows(2 * sc, a, a.kv_heads, 100 + r);
  const Tensor v = rand_rows(2 * sc, a, a.kv_heads, 200 + r), dout = rand_rows(2 * sc, a, a.heads, 300 + r);
  const double scale = 1.0 / std::sqrt(static_cast<double>(a.head_dim));
  Tensor o = Tensor::empty(q.shape(), DType::F32), lse = Tensor::empty({a.batch, a.heads, 2 * sc}, DType::F32);
  Tensor dq = Tensor::empty(q.shape(), DType::F32), dk = Tensor::empty(k.shape(), DType::F32);
  Tensor dv = Tensor::empty(k.shape(), DType::F32);
  PeakSampler peak(cp.bf16 ? DType::BF16 : DType::F32);
  std::vector<double> t_ring, t_compute, t_blocked;
  auto max_over_ranks = [&](double x) {
    Tensor t = Tensor::empty({1}, DType::F64);
    t.set_item(0, x);
    cpg.all_reduce(t, comm::ReduceOp::Max);
    return t.item(0);
  };
  for (int it = 0; it <= a.iters; it++) {  // iteration 0 warms up
    peak.sample();
    cpg.barrier();
    auto& counters = comm::comm_counters();
    double blocked0 = 0;
    for (const auto& [key, c] : counters)
      if (key.rfind("cp:", 0) == 0) blocked0 += c.blocked_seconds;
    Stopwatch sw;
    nn::context_attention_forward(q, k, v, scale, cp, o, lse);
    nn::context_attention_backward(dout, q, k, v, o, lse, scale, cp, dq, dk, dv);
    const double ring = sw.seconds();
    double blocked = -blocked0;
    for (const auto& [key, c] : counters)
      if (key.rfind("cp:", 0) == 0) blocked += c.blocked_seconds;
    cpg.barrier();
    Stopwatch sw2;
    blocks_only(q, k, v, dout, C, r, scale, cp.bf16);
    const double compute = sw2.seconds();
    if (it == 0) continue;
    t_ring.push_back(max_over_ranks(ring));
    t_compute.push_back(max_over_ranks(compute));
    t_blocked.push_back(max_over_ranks(blocked));
  }
  peak.sample();
  if (r != 0) return;
  const double mib = 1024.0 * 1024.0, ring = median(t_ring), compute = median(t_compute);
  const double flops_rank = bal_max * head_flops * 3;  // forward 4·D, backward 8·D per pair (model FLOPs)
  fmt::print("moecore bench context: C={} ranks, S={} B={} heads {}/{} D={}, {}, --cp-comm-type {}, {} timed runs\n", C,
             S, a.batch, a.heads, a.kv_heads, a.head_dim, a.dtype, a.comm_type, a.iters);
  fmt::print("context flops split=load_balanced max_over_min={:.4f} max_gflop={:.3f} min_gflop={:.3f}\n",
             bal_max / bal_min, bal_max * head_flops / 1e9, bal_min * head_flops / 1e9);
  fmt::print("context flops split=contiguous max_over_min={:.4f} max_gflop={:.3f} min_gflop={:.3f}\n",
             naive_max / naive_min, naive_max * head_flops / 1e9, naive_min * head_flops / 1e9);
  fmt::print("context memory saved_mib={:.2f} c1_saved_mib={:.2f} ratio={:.4f} ring_transient_mib={:.2f}\n",
             saved(rows) / mib, saved(static_cast<double>(S)) / mib, saved(rows) / saved(static_cast<double>(S)),
             ring_transient / mib);
  fmt::print(
      "context time fwd_bwd_s={:.4f} compute_only_s={:.4f} exposed_comm_s={:.4f} exposed_fraction={:.3f} "
      "blocked_s={:.4f}\n",
      ring, compute, std::max(0.0, ring - compute), std::max(0.0, ring - compute) / ring, median(t_blocked));
  const double gflops = flops_rank / ring / 1e9;
  std::vector<double> rates;  // each run's (the slowest rank's)
  for (double t : t_ring) rates.push_back(flops_rank / t / 1e9);
  fmt::print("context attention_gflops={:.2f} peak_gflops={:.2f} peak_ratio={:.3f} paired_ratio={:.3f}\n", gflops,
             peak.median(), gflops / peak.median(), paired_peak_ratio(rates, peak.samples()));
  fmt::print("  {}\n", peak.describe());
  fmt::print("  {}\n", describe_paired(rates, peak.samples()));
}

}  // namespace

BenchCommand add_context_bench(CLI::App& bench) {
  auto a = std::make_shared<ContextBenchArgs>();
  CLI::App* cmd = bench.add_subcommand(
      "context", "Under mpirun: attention over context parallelism: FLOP balance, memory, exposed ring communication");
  cmd->add_option("--seq-length", a->seq, "S")->check(CLI::Range(int64_t{2}, int64_t{1} << 20))->capture_default_str();
  cmd->add_option("--micro-batch-size", a->batch, "B")->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_option("--num-attention-heads", a->heads, "query heads")->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_option("--num-query-groups", a->kv_heads, "kv heads")->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_option("--kv-channels", a->head_dim, "head dim")->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_option("--iters", a->iters, "Timed runs")->check(CLI::Range(1, 1000))->capture_default_str();
  cmd->add_option("--dtype", a->dtype, "f32, or bf16 (operands rounded as --bf16 training rounds them)")
      ->check(CLI::IsMember({"f32", "bf16"}))
      ->capture_default_str();
  cmd->add_option("--cp-comm-type", a->comm_type, "p2p, a2a or allgather")
      ->check(CLI::IsMember({"p2p", "a2a", "allgather"}))
      ->capture_default_str();
  return {cmd, [a] { run_bench_context(*a); }};
}

}  // namespace moecore::cli
