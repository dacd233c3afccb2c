// Activation recompute (nn/recompute.h) on one rank: every option (full uniform and block, each selective module,
// combinations) gives bitwise the losses, every parameter gradient, and the router's statistics, counters and
// noise position of the run without recompute, over two accumulated micro-batches with dropout and router jitter
// on; and the stash really holds less after forward (allocator live bytes).
#include <gtest/gtest.h>

#include <cstdio>
#include <ostream>
#include <string>
#include <vector>

#include "model_util.h"
#include "moecore/core/allocator.h"
#include "moecore/moe/moe_layer.h"
#include "moecore/nn/gpt_model.h"
#include "test_util.h"

namespace moecore {
namespace {

using RC = nn::RecomputeConfig;

struct Result {
  std::vector<double> losses;
  std::vector<Tensor> grads;
  std::vector<std::vector<double>> router;  // per MoE layer: statistics and counters
  int64_t stash_bytes = 0;                  // live bytes the first micro-batch's forward left behind
  int64_t late_system_allocs = 0;           // system allocations in micro-batches 2 and 3 (of 4)
};

std::vector<double> router_state(moe::MoELayer& l) {
  const nn::RoutingStats& s = l.stats();
  std::vector<double> v(s.tokens_per_expert.begin(), s.tokens_per_expert.end());
  v.insert(v.end(), s.loss_sums.begin(), s.loss_sums.end());
  v.push_back(s.z_loss_sum);
  v.push_back(s.entropy_sum);
  v.push_back(static_cast<double>(s.tokens + s.assignments + s.dropped));
  v.push_back(static_cast<double>(s.micro_batches));
  v.push_back(static_cast<double>(l.router().forward_count()));
  const Tensor& c = l.router().local_tokens_per_expert();
  for (int64_t i = 0; i < c.numel(); i++) v.push_back(c.item(i));
  return v;
}

// Three layers (dense, then two MoE layers with a gated shared expert), dropout, qk-norm, jitter, aux and z losses.
// mtp: MTP depths (their layer of the last layer's kind: MoE); mtp_recompute: whether full uniform recompute
// checkpoints them (Megatron's, the trainer's choice) or, false, leaves them alone.
Result run(const RC& rc, moe::LoadBalancingType balance = moe::LoadBalancingType::AuxLoss, int micro_batches = 2,
           bool bf16 = false, int64_t mtp = 0, bool mtp_recompute = true, bool mla = false) {
  nn::GPTConfig c = testing::small_gpt(
      {.layers = 3, .hidden = 16, .ffn = 24, .heads = 4, .kv_heads = 2, .head_dim = 4, .vocab = 29, .max_seq = 8});
  c.hidden_dropout = 0.1;
  c.attention_dropout = 0.1;
  c.qk_layernorm = true;
  c.seed = 11;
  c.recompute = rc;
  c.mtp.num_layers = mtp;
  c.mtp.recompute = mtp_recompute && rc.full && rc.method == RC::Method::Uniform;
  c.low = bf16 ? LowPrecision(DType::BF16) : std::nullopt;
  c.normalization = bf16 ? nn::NormKind::LayerNorm : nn::NormKind::RMSNorm;
  if (mla) {  // Multi-Latent Attention with YaRN and its latent norms (qk_layernorm)
    c.mla.enabled = true;
    c.mla.q_lora_rank = 8, c.mla.kv_lora_rank = 6, c.mla.qk_head_dim = 4, c.mla.qk_pos_emb_head_dim = 4;
    c.mla.v_head_dim = 6, c.mla.yarn_params.scaling_factor = 4;
    c.mla.recompute_up_proj = rc.mla_up_proj;
  }
  moe::MoELayerConfig mc;
  mc.low = bf16 ? LowPrecision(DType::BF16) : std::nullopt;
  mc.router.hidden = 16;
  mc.router.num_experts = 4;
  mc.router.topk = 2;
  mc.router.load_balancing = {balance};
  mc.router.aux_loss_coeff = {0.01};
  mc.router.z_loss_coeff = 1e-3;
  mc.router.input_jitter_eps = 0.01;
  mc.router.init_std = 0.5;
  mc.ffn_hidden = 12;
  mc.shared_ffn_hidden = 8;
  mc.shared_expert_gate = true;
  mc.init_std = mc.output_init_std = 0.3;
  mc.recompute_moe = rc.moe;
  mc.recompute_moe_act = rc.moe_act;
  mc.recompute_shared_experts = rc.shared_experts;
  nn::FfnFactory ffn = [mc](nn::ParamRegistry& r, const std::string& name,
                            int64_t i) -> std::unique_ptr<nn::FeedForward> {
    if (i == 0) return nullptr;
    return std::make_unique<moe::MoELayer>(r, name, mc);
  };
  nn::ParamRegistry reg;
  nn::GPTModel model(c, reg, ffn);
  reg.initialize(5);
  Result out;
  auto st = model.make_stash();
  const int64_t B = 2, S = 8;
  AllocatorMark mark;
  for (int mb = 0; mb < micro_batches; mb++) {
    if (mb == 2) mark = Allocator::instance().mark();
    Tensor tokens = Tensor::empty({B, S}, DType::I64), labels = Tensor::empty({B, S}, DType::I64);
    for (int64_t i = 0; i < B * S; i++) {
      tokens.set_item(i, static_cast<double>((i * 7 + mb % 2 * 5 + 3) % 29));
      labels.set_item(i, static_cast<double>((i * 11 + mb % 2 * 3 + 1) % 29));
    }
    st.sample_B = {2 * mb, 2 * mb + 1};
    const int64_t before = Allocator::instance().stats().live_bytes;
    out.losses.push_back(model.forward(tokens, labels, Tensor(), st));
    if (mb == 0) out.stash_bytes = Allocator::instance().stats().live_bytes - before;
    model.backward(st, 0.5);
  }
  if (micro_batches > 2) out.late_system_allocs = Allocator::instance().system_allocs_since(mark);
  for (const auto& p : reg.all()) out.grads.push_back(p->grad.clone());
  for (size_t i = 1; i < model.num_layers(); i++)
    out.router.push_back(router_state(dynamic_cast<moe::MoELayer&>(model.layer(i).ffn())));
  for (size_t k = 0; model.mtp() && k < model.mtp()->num_layers(); k++)
    out.router.push_back(router_state(dynamic_cast<moe::MoELayer&>(model.mtp()->layer(k).ffn())));
  for (double l : model.take_mtp_losses()) out.losses.push_back(l);
  return out;
}

void expect_recompute_bitwise(const Result& a, const Result& b, const std::string& what) {
  ASSERT_EQ(a.losses.size(), b.losses.size());
  for (size_t i = 0; i < a.losses.size(); i++) EXPECT_EQ(a.losses[i], b.losses[i]) << what << " loss " << i;
  ASSERT_EQ(a.grads.size(), b.grads.size());
  for (size_t i = 0; i < a.grads.size(); i++)
    EXPECT_TRUE(testing::bitwise_equal(a.grads[i], b.grads[i])) << what << " gradient " << i;
  EXPECT_EQ(a.router, b.router) << what << ": router statistics, counters or noise position";
}

struct Option {
  std::string name;
  RC rc;
};
void PrintTo(const Option& o, std::ostream* os) {
  *os << o.name;
}

std::vector<Option> options() {
  auto full = [](RC::Method m, int64_t n) {
    RC r;
    r.full = true;
    r.method = m;
    r.num_layers = n;
    return r;
  };
  auto sel = [](std::initializer_list<bool RC::*> mods) {
    RC r;
    for (auto m : mods) r.*m = true;
    return r;
  };
  return {{"full_uniform_1", full(RC::Method::Uniform, 1)},
          {"full_uniform_2", full(RC::Method::Uniform, 2)},
          {"full_uniform_all", full(RC::Method::Uniform, 3)},
          {"full_block_2", full(RC::Method::Block, 2)},
          {"core_attn", sel({&RC::core_attn})},
          {"moe_act", sel({&RC::moe_act})},
          {"layernorm", sel({&RC::layernorm})},
          {"mlp", sel({&RC::mlp})},
          {"moe", sel({&RC::moe})},
          {"shared_experts", sel({&RC::shared_experts})},
          {"layernorm_mlp_moe", sel({&RC::layernorm, &RC::mlp, &RC::moe})},
          {"layernorm_shared_experts_moe_act", sel({&RC::layernorm, &RC::shared_experts, &RC::moe_act})},
          {"all", sel({&RC::core_attn, &RC::moe_act, &RC::layernorm, &RC::mlp, &RC::moe, &RC::shared_experts})}};
}

class RecomputeExact : public ::testing::TestWithParam<Option> {};

TEST_P(RecomputeExact, BitwiseLikeNoRecomputeAndStashHoldsLess) {
  const Result base = run(RC{});
  const Result r = run(GetParam().rc);
  expect_recompute_bitwise(base, r, GetParam().name);
  EXPECT_LT(r.stash_bytes, base.stash_bytes) << GetParam().name << ": the stash does not hold less";
  std::printf("recompute %s: forward leaves %lld of %lld bytes\n", GetParam().name.c_str(),
              static_cast<long long>(r.stash_bytes), static_cast<long long>(base.stash_bytes));
}

INSTANTIATE_TEST_SUITE_P(Options, RecomputeExact, ::testing::ValuesIn(options()),
                         [](const ::testing::TestParamInfo<Option>& i) { return i.param.name; });

// global_aux_loss accumulates counts over the micro-batches of a global batch: a replay must start from the counts
// its forward saw, and add none.
TEST(RecomputeExact, GlobalAuxLossReplaysItsCounts) {
  const Result base = run(RC{}, moe::LoadBalancingType::GlobalAuxLoss);
  for (const Option& o : options())
    expect_recompute_bitwise(base, run(o.rc, moe::LoadBalancingType::GlobalAuxLoss), o.name);
}

// bf16 GEMMs (the linears keep bf16 copies of their inputs, the experts bf16 activations) and LayerNorm.
TEST(RecomputeExact, Bf16AndLayerNorm) {
  const Result base = run(RC{}, moe::LoadBalancingType::AuxLoss, 2, true);
  for (const Option& o : options()) {
    const Result r = run(o.rc, moe::LoadBalancingType::AuxLoss, 2, true);
    expect_recompute_bitwise(base, r, o.name);
    EXPECT_LT(r.stash_bytes, base.stash_bytes) << o.name;
  }
}

// Recompute's replays reuse the allocator's cached blocks: once warm, micro-batches take no memory from the system.
TEST(RecomputeExact, SteadyStateAllocatesNothingNew) {
  for (const Option& o : options())
    EXPECT_EQ(run(o.rc, moe::LoadBalancingType::AuxLoss, 4).late_system_allocs, 0) << o.name;
}

// Megatron checkpoints each MTP depth's enorm/hnorm, eh_proj and transformer layer under full uniform recompute:
// the same bits (losses, MTP losses, gradients, the MTP MoE layers' router statistics), and the depths hold less.
TEST(RecomputeExact, MtpDepthsUnderFullUniformRecompute) {
  RC full;
  full.full = true;
  full.num_layers = 1;
  const Result base = run(RC{}, moe::LoadBalancingType::AuxLoss, 2, false, 2);
  const Result r = run(full, moe::LoadBalancingType::AuxLoss, 2, false, 2);
  expect_recompute_bitwise(base, r, "full uniform 1 with MTP");
  const Result kept = run(full, moe::LoadBalancingType::AuxLoss, 2, false, 2, false);
  expect_recompute_bitwise(base, kept, "full uniform 1, MTP depths not recomputed");
  EXPECT_LT(r.stash_bytes, kept.stash_bytes) << "the MTP depths keep their whole stash under recompute";
}

// Multi-Latent Attention layers with an MTP depth, f32 and bf16, under --recompute-modules mla_up_proj (q, k, v
// rebuilt from the latents before the kernel's backward), with mlp (Megatron's DeepSeek-V3 recipe), core_attn (the
// kernel again), layernorm (the input norm's output again), all of them, and full recompute: the same bits, and the
// stash holds less.
TEST(RecomputeExact, MultiLatentAttention) {
  RC up, recipe, core, norms, every, full;
  up.mla_up_proj = true;
  recipe.mla_up_proj = recipe.mlp = true;
  core.core_attn = true;
  norms.layernorm = true;
  every.mla_up_proj = every.core_attn = every.layernorm = every.moe_act = every.mlp = every.moe = true;
  every.shared_experts = true;
  full.full = true, full.num_layers = 1;
  for (bool bf16 : {false, true}) {
    const Result base = run(RC{}, moe::LoadBalancingType::AuxLoss, 2, bf16, 1, true, true);
    for (const auto& [name, rc] : std::vector<std::pair<std::string, RC>>{{"mla_up_proj", up},
                                                                          {"mla_up_proj mlp", recipe},
                                                                          {"core_attn", core},
                                                                          {"layernorm", norms},
                                                                          {"every module", every},
                                                                          {"full", full}}) {
      const Result r = run(rc, moe::LoadBalancingType::AuxLoss, 2, bf16, 1, true, true);
      expect_recompute_bitwise(base, r, name + (bf16 ? " bf16" : ""));
      EXPECT_LT(r.stash_bytes, base.stash_bytes) << name;
    }
  }
}

TEST(RecomputeConfig, UniformAndBlockChunks) {
  RC r;
  r.full = true;
  r.num_layers = 2;
  auto chunk = [&](int64_t i) {
    const RC::Chunk c = r.chunk(i, 5);
    return std::pair<int64_t, int64_t>{c.begin, c.end};
  };
  EXPECT_EQ(chunk(0), (std::pair<int64_t, int64_t>{0, 2}));
  EXPECT_EQ(chunk(3), (std::pair<int64_t, int64_t>{2, 4}));
  EXPECT_EQ(chunk(4), (std::pair<int64_t, int64_t>{4, 5}));  // the last chunk is shorter (Megatron's min)
  r.method = RC::Method::Block;
  EXPECT_EQ(chunk(1), (std::pair<int64_t, int64_t>{1, 2}));
  EXPECT_FALSE(r.chunk(2, 5).on());  // block: only the first num_layers layers
  r.full = false;
  EXPECT_FALSE(r.chunk(0, 5).on());
}

}  // namespace
}  // namespace moecore
