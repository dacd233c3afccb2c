// `moecore bench moe-layer`: one MoE layer (router, dispatch, SwiGLU experts, combine) forward+backward GFLOP/s
// against the same-run GEMM peak, on one rank. Not a training step (bench train) or communication (bench comm).
#include "moecore/moe/moe_layer.h"

#include <fmt/format.h>

#include <map>

#include "moecore/cli/bench/bench_util.h"
#include "moecore/cli/bench/benches.h"
#include "moecore/core/cpu.h"
#include "moecore/core/timer.h"
#include "moecore/core/timers.h"
#include "moecore/device/device_select.h"
#include "moecore/device/runtime.h"
#include "moecore/kernels/gemm.h"

namespace moecore::cli {

namespace {
struct MoEBenchArgs {
  int64_t tokens = 4096, hidden = 1024, ffn = 512, experts = 16, topk = 4;
  std::string dtype = "f32";
  int iters = 3;
  bool force_balance = false;
  std::string device = "cpu";
};

void run_bench_moe_layer(const MoEBenchArgs& a) {
  MOE_CHECK(a.dtype == "f32" || a.dtype == "bf16", "--dtype must be f32 or bf16, got {}", a.dtype);
  const bool bf16 = a.dtype == "bf16";
  const Device dev = device::resolve_device(a.device, "bench moe-layer");
  fmt::print("moecore bench moe-layer: T={} H={} F={} E={} k={} dtype={} SwiGLU, {} timed runs, on {}\n", a.tokens,
             a.hidden, a.ffn, a.experts, a.topk, a.dtype, a.iters, device::describe_device(dev));
  moe::MoELayerConfig c;
  c.router.hidden = a.hidden;
  c.router.num_experts = a.experts;
  c.router.topk = a.topk;
  c.router.force_load_balancing = a.force_balance;
  c.ffn_hidden = a.ffn;
  c.low = bf16 ? LowPrecision(DType::BF16) : std::nullopt;
  nn::ParamRegistry reg(DType::F32);
  moe::MoELayer layer(reg, "mlp", c);
  reg.initialize(1);
  reg.to(dev);
  Tensor x = Tensor::empty({a.tokens, 1, a.hidden}, DType::F32), dy = Tensor::empty(x.shape(), DType::F32);
  fill_random(x, 7, 1.0);
  fill_random(dy, 8, 1.0);
  x = x.to(dev);
  dy = dy.to(dev);
  auto st = layer.make_stash();
  // Three H×F GEMMs per routed token (fc1 gate and linear halves, fc2), 2 FLOPs per multiply-add, ×3 for
  // forward + backward (data and weight gradients).
  const double flops = 3.0 * 2.0 * a.hidden * a.ffn * static_cast<double>(a.tokens * a.topk) * 3.0;
  std::vector<double> rates;
  PeakSampler peak(bf16 ? DType::BF16 : DType::F32, dev);
  // Where a CPU run's time goes (mean of the timed runs): oneDNN GEMM time from gemm_stats, the router and the
  // permutation copies from their level-2 timers; the rest is the activation, padding copies, casts and the combine.
  Timers timers(2);
  const Timers::Install install(&timers);
  const std::vector<std::string> parts = {"moe-router", "moe-permute"};
  double gemm_s = 0, gemm_flops = 0, run_s = 0;
  GemmShapeTally shapes(/*merge_rows=*/true);  // the experts' row chunks as one shape each
  std::map<std::string, double> part_s;
  // One forward+backward as a training step of one micro-batch runs it; the seconds it took.
  const auto one_run = [&] {
    reg.zero_grad(/*lazy=*/true);  // as a training step zeroes them: its weight-gradient GEMMs overwrite them
    // A training step finds each weight's bf16 copy written by the last optimizer update (AdamW::step) and takes
    // it as it is. The weights do not change here, so the copy the last run made stands for it.
    for (auto& prm : reg.all()) prm->low_cache_from_update = prm->low_cache.defined();
    const Stopwatch timer;
    {
      // The bf16 copy of each weight taken once for the forward and backward (packed with
      // MOECORE_PACK_WEIGHTS=on, kernels::pack_weights_for).
      const nn::Bf16WeightScope bf16_weights(reg, kernels::pack_weights_for(1));
      layer.forward(x, *st);
      layer.backward(dy, *st);
    }
    reg.settle_grads();
    device::synchronize(dev);  // the GPU's queued work belongs to this run
    return timer.seconds();
  };
  for (int i = 0; i <= a.iters; i++) {
    if (i > 0) peak.sample();  // interleaved with the timed runs (after the warm-up)
    for (const std::string& n : parts) timers.elapsed(n, /*reset=*/true);
    const kernels::GemmStats g0 = kernels::gemm_stats();
    if (i > 0) shapes.begin();
    const double dt = one_run();
    if (i == 0) continue;
    rates.push_back(flops / dt / 1e9);
    shapes.end();
    const kernels::GemmStats g1 = kernels::gemm_stats();
    gemm_s += (g1.seconds - g0.seconds) / a.iters;
    gemm_flops += (g1.flops - g0.flops) / a.iters;
    run_s += dt / a.iters;
    for (const std::string& n : parts) part_s[n] += timers.elapsed(n) / a.iters;
  }
  peak.sample();
  const double rate = median(rates), p = peak.median();
  layer.finish_global_batch();  // the steps so far as one global batch
  const nn::RoutingStats& load = *layer.routing_stats();
  fmt::print("  load: max/mean tokens per expert {:.2f} (over {} steps)\n", load.max_load() / load.mean_load(),
             a.iters + 1);
  fmt::print("  {}\n", peak.describe());
  if (gemm_s > 0) {  // the host-timed GEMMs (the CPU backend tallies them)
    const double rest = run_s - gemm_s - part_s["moe-router"] - part_s["moe-permute"];
    fmt::print(
        "  a run: {:.4f} s; GEMMs {:.4f} s ({:.0f}%) at {:.1f} GFLOP/s ({:.2f} of the peak), router {:.4f} s, token "
        "permutation {:.4f} s, the rest (activation, padding, casts, combine) {:.4f} s\n",
        run_s, gemm_s, 100 * gemm_s / run_s, gemm_flops / gemm_s / 1e9, gemm_flops / gemm_s / 1e9 / p,
        part_s["moe-router"], part_s["moe-permute"], rest);
    fmt::print("  the layer's GEMMs by shape (all row counts of a shape together):\n");
    print_gemm_shapes(shapes.shapes(), p, 8);
  }
  fmt::print("  {}\n", describe_paired(rates, peak.samples()));
  fmt::print("moe_layer dtype={} gflops={:.1f} peak_gflops={:.1f} ratio={:.3f} paired_ratio={:.3f}\n", a.dtype, rate, p,
             rate / p, paired_peak_ratio(rates, peak.samples()));
}
}  // namespace

BenchCommand add_moe_layer_bench(CLI::App& bench) {
  auto a = std::make_shared<MoEBenchArgs>();
  CLI::App* cmd = bench.add_subcommand("moe-layer", "One MoE layer forward+backward GFLOP/s vs GEMM peak");
  cmd->add_option("--tokens", a->tokens, "T")->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_option("--hidden", a->hidden, "H")->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_option("--ffn", a->ffn, "F (per expert)")->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_option("--experts", a->experts, "E")->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_option("--topk", a->topk, "k")->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_option("--dtype", a->dtype, "f32 or bf16")->check(CLI::IsMember({"f32", "bf16"}))->capture_default_str();
  cmd->add_option("--iters", a->iters, "Timed runs")->check(CLI::Range(1, 1000))->capture_default_str();
  cmd->add_flag("--moe-router-force-load-balancing", a->force_balance, "Route on random logits");
  cmd->add_option("--device", a->device, "cpu, cuda[:N] or auto (the GPU when one is visible)")->capture_default_str();
  return {cmd, [a] { run_bench_moe_layer(*a); }};
}

}  // namespace moecore::cli
