// `moecore bench mla`: one Multi-Latent Attention module (DeepSeek-V3's: q and kv down projections, latent norms,
// up projections, decoupled RoPE with YaRN, causal attention, output projection) forward+backward GFLOP/s against
// the same-run GEMM peak of its dtype, with the share of the time the attention core takes. Defaults: DeepSeek-V3's
// per-head shapes (q/k 128 + 64 channels, v 128, q_lora 1536, kv_lora 512 at H 7168) with the hidden size and head
// count scaled to a CPU: H 1024, 8 heads, q_lora 384, kv_lora 256.
#include <fmt/format.h>

#include <cmath>

#include "moecore/cli/bench/bench_util.h"
#include "moecore/cli/bench/benches.h"
#include "moecore/core/cpu.h"
#include "moecore/core/timer.h"
#include "moecore/core/timers.h"
#include "moecore/nn/mla_attention.h"

namespace moecore::cli {

namespace {
struct MLABenchArgs {
  int64_t seq = 2048, batch = 1, hidden = 1024, heads = 8, q_lora = 384, kv_lora = 256, qk = 128, rope = 64, v = 128;
  int iters = 3;
  std::string dtype = "f32";
};

void run_bench_mla(const MLABenchArgs& a) {
  const bool bf16 = a.dtype == "bf16";
  fmt::print(
      "moecore bench mla: S={} B={} H={} heads={} q_lora={} kv_lora={} qk={}+{} v={} YaRN, {}, {} timed runs, {} "
      "threads\n",
      a.seq, a.batch, a.hidden, a.heads, a.q_lora, a.kv_lora, a.qk, a.rope, a.v, a.dtype, a.iters, num_threads());
  nn::AttentionConfig ac;
  ac.hidden = a.hidden, ac.num_heads = a.heads, ac.max_seq_len = a.seq, ac.qk_layernorm = true;
  ac.low = bf16 ? LowPrecision(DType::BF16) : std::nullopt;
  nn::MLAConfig m;
  m.enabled = true, m.q_lora_rank = a.q_lora, m.kv_lora_rank = a.kv_lora, m.qk_head_dim = a.qk;
  m.qk_pos_emb_head_dim = a.rope, m.v_head_dim = a.v;
  m.yarn_params.scaling_factor = 40, m.yarn_params.mscale = 1, m.yarn_params.mscale_all_dim = 1;
  nn::ParamRegistry reg(DType::F32);
  nn::MLAttention mla(reg, "attn", ac, m);
  reg.initialize(1);
  Tensor x = Tensor::empty({a.seq, a.batch, a.hidden}, DType::F32), dy = Tensor::empty(x.shape(), DType::F32);
  fill_random(x, 7, 1.0);
  fill_random(dy, 8, 1.0);
  // Useful FLOPs (2 per multiply-add): the projections' weights times the tokens, ×3 for forward + backward; the
  // causal core QKᵀ over qk + rope channels and PV over v, half of S² each, ×3.5 for forward + backward (as
  // FlashAttention counts). The kernel's zero padding of v to the q/k width is not counted.
  const double T = static_cast<double>(a.seq * a.batch), N = static_cast<double>(a.heads);
  const double proj_weights = static_cast<double>(a.q_lora * a.hidden) + N * (a.qk + a.rope) * a.q_lora +
                              static_cast<double>((a.kv_lora + a.rope) * a.hidden) + N * (a.qk + a.v) * a.kv_lora +
                              static_cast<double>(a.hidden) * N * a.v;
  const double proj_flops = 2.0 * T * proj_weights * 3.0;
  const double core_flops = 2.0 * static_cast<double>(a.seq) * a.seq / 2.0 * (a.qk + a.rope + a.v) * N * a.batch * 3.5;
  std::vector<double> rates, core_shares;
  PeakSampler peak(bf16 ? DType::BF16 : DType::F32);
  Timers timers(2);  // the module's "attention-core" timer: the kernels' share of the time
  const Timers::Install install(&timers);
  for (int i = 0; i <= a.iters; i++) {
    if (i > 0) peak.sample();  // interleaved with the timed runs (after the warm-up)
    reg.zero_grad();
    nn::MLAttention::Stash st;
    timers.elapsed("attention-core", true);
    const Stopwatch timer;
    mla.forward(x, st);
    mla.backward(dy, st);
    const double dt = timer.seconds();
    if (i == 0) continue;  // warm-up
    rates.push_back((proj_flops + core_flops) / dt / 1e9);
    core_shares.push_back(timers.elapsed("attention-core") / dt);
  }
  peak.sample();
  const double rate = median(rates), p = peak.median();
  fmt::print("  {}\n", peak.describe());
  fmt::print(
      "  MLA forward+backward: {:8.1f} GFLOP/s ({:.1f}% of GEMM peak); projections {:.0f}% of the FLOPs, the "
      "attention core {:.0f}% of the time\n",
      rate, 100.0 * rate / p, 100.0 * proj_flops / (proj_flops + core_flops), 100.0 * median(core_shares));
  fmt::print("  {}\n", describe_paired(rates, peak.samples()));
  fmt::print("mla dtype={} gflops={:.1f} peak_gflops={:.1f} ratio={:.3f} paired_ratio={:.3f}\n", a.dtype, rate, p,
             rate / p, paired_peak_ratio(rates, peak.samples()));
}
}  // namespace

BenchCommand add_mla_bench(CLI::App& bench) {
  auto a = std::make_shared<MLABenchArgs>();
  CLI::App* cmd = bench.add_subcommand("mla", "Multi-Latent Attention module forward+backward GFLOP/s vs GEMM peak");
  cmd->add_option("--seq-length", a->seq, "S")->check(CLI::Range(int64_t{2}, int64_t{1} << 17))->capture_default_str();
  cmd->add_option("--micro-batch-size", a->batch, "B")->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_option("--hidden-size", a->hidden, "H")->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_option("--num-attention-heads", a->heads, "heads")->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_option("--q-lora-rank", a->q_lora, "query latent rank")->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_option("--kv-lora-rank", a->kv_lora, "kv latent rank")->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_option("--qk-head-dim", a->qk, "q/k channels without RoPE")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--qk-pos-emb-head-dim", a->rope, "RoPE channels (even)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--v-head-dim", a->v, "value channels")->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_option("--iters", a->iters, "Timed runs")->check(CLI::Range(1, 1000))->capture_default_str();
  cmd->add_option("--dtype", a->dtype, "f32 or bf16 (as --bf16 trains)")
      ->check(CLI::IsMember({"f32", "bf16"}))
      ->capture_default_str();
  return {cmd, [a] {
            MOE_CHECK(a->rope % 2 == 0, "--qk-pos-emb-head-dim {} must be even (RoPE rotates pairs)", a->rope);
            run_bench_mla(*a);
          }};
}

}  // namespace moecore::cli
