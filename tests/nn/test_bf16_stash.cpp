// Activation stashes under --bf16 (docs/differences.md, "bf16 compute"): after a forward every tensor a module keeps
// for backward is bf16 except the statistics (the norms' rstd and mean, attention's lse, the router's logits, scores
// and probabilities, the loss's logsumexp), checked on the stashes of a GPT model with a dense and an MoE layer (a
// gated shared expert, qk-norm) and of one with Multi-Latent Attention; the forward leaves about half the bytes of the
// same model's f32 forward; and a step with bf16 stashes gives gradients within bf16 rounding of the f32 model's.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "model_util.h"
#include "moecore/core/allocator.h"
#include "moecore/moe/moe_layer.h"
#include "moecore/nn/gpt_model.h"
#include "moecore/nn/mlp.h"
#include "test_util.h"

namespace moecore {
namespace {

struct Bf16StashRun {
  double loss = 0;
  std::vector<Tensor> grads;
  std::vector<std::string> names;
  int64_t stash_bytes = 0;  // live bytes the forward left behind
};

void expect_dtype(const Tensor& t, DType dt, const std::string& what) {
  ASSERT_TRUE(t.defined()) << what;
  EXPECT_EQ(t.dtype(), dt) << what << " is " << dtype_name(t.dtype());
}

// The stash of a dense MLP, an MoE layer (router, experts, gated shared expert) and the layer around them.
void expect_bf16_stash(const nn::GPTModel::Stash& st, bool mla) {
  const DType b = DType::BF16, f = DType::F32;
  for (size_t i = 0; i < st.layers.size(); i++) {
    const nn::TransformerLayer::Stash& l = st.layers[i];
    const std::string at = "layer " + std::to_string(i) + " ";
    expect_dtype(l.input_norm.x, b, at + "input norm's input");
    expect_dtype(l.input_norm.rstd, f, at + "input norm's rstd");
    expect_dtype(l.pre_mlp_norm.x, b, at + "pre-MLP norm's input");
    if (mla) {
      const nn::MLAttention::Stash& a = l.mla;
      expect_dtype(a.q_SBNA, b, at + "MLA q");
      expect_dtype(a.k_SBNA, b, at + "MLA k");
      expect_dtype(a.v_SBNA, b, at + "MLA v");
      EXPECT_FALSE(a.o_SBNA.defined()) << at << "MLA keeps o only as the output projection's input";
      expect_dtype(a.proj.x, b, at + "MLA output projection's input");
      expect_dtype(a.lse_BNS, f, at + "MLA lse");
      expect_dtype(a.q_norm.x, b, at + "q latent norm's input");
      expect_dtype(a.kv_norm.x, b, at + "kv latent norm's input");
      expect_dtype(a.kv_down.x, b, at + "kv_down's input");
      EXPECT_TRUE(a.kv_down.x.shares_storage(a.q_down.x)) << at << "the down projections share one bf16 input";
    } else {
      const nn::Attention::Stash& a = l.attn;
      expect_dtype(a.q_SBND, b, at + "attention q");
      expect_dtype(a.k_SBND, b, at + "attention k");
      expect_dtype(a.v_SBND, b, at + "attention v");
      EXPECT_FALSE(a.o_SBND.defined()) << at << "attention keeps o only as the output projection's input";
      expect_dtype(a.proj.x, b, at + "output projection's input");
      expect_dtype(a.lse_BNS, f, at + "attention lse");
      expect_dtype(a.q_norm.x, b, at + "q norm's input");
      expect_dtype(a.q_norm.rstd, f, at + "q norm's rstd");
    }
    if (i == 0) {
      const auto& m = dynamic_cast<const nn::MLP::Stash&>(*l.ffn);
      expect_dtype(m.fc1.x, b, at + "fc1's input");
      expect_dtype(m.h, b, at + "fc1's output");
      expect_dtype(m.fc2.x, b, at + "the activation");
      continue;
    }
    const auto& m = dynamic_cast<const moe::MoELayer::Stash&>(*l.ffn);
    expect_dtype(m.router.x_r, b, at + "router's gating input");
    expect_dtype(m.router.logits_TE, f, at + "router logits");
    expect_dtype(m.router.p_TK, f, at + "router probabilities");
    expect_dtype(m.router.aux_scores_TE, f, at + "aux-loss scores");
    expect_dtype(m.experts.x_RH, b, at + "experts' rows");
    expect_dtype(m.experts.h_RF1, b, at + "experts' fc1 output");
    expect_dtype(m.experts.a_RF, b, at + "experts' activation");
    expect_dtype(m.experts.probs_R, f, at + "experts' probabilities");
    expect_dtype(m.shared.x_TH, b, at + "shared gate's input");
    expect_dtype(m.shared.out_TH, b, at + "shared experts' output");
    expect_dtype(dynamic_cast<const nn::MLP::Stash&>(*m.shared.mlp).h, b, at + "shared experts' fc1 output");
  }
  expect_dtype(st.final_norm.x, b, "final norm's input");
  expect_dtype(st.lse_T, f, "the loss's logsumexp");
}

// Two layers (dense, then MoE with a gated shared expert), qk-norm; MLA with its latent norms when `mla`.
Bf16StashRun bf16_stash_run(bool bf16, bool mla) {
  nn::GPTConfig c = testing::small_gpt({.layers = 2,
                                        .hidden = 64,
                                        .ffn = 96,
                                        .heads = 4,
                                        .kv_heads = 2,
                                        .head_dim = 16,
                                        .vocab = 128,
                                        .max_seq = 64,
                                        .init_std = 0.05});
  c.qk_layernorm = true;
  c.seed = 3;
  c.low = bf16 ? LowPrecision(DType::BF16) : std::nullopt;
  if (mla) {
    c.mla.enabled = true;
    c.mla.q_lora_rank = 32, c.mla.kv_lora_rank = 24, c.mla.qk_head_dim = 16, c.mla.qk_pos_emb_head_dim = 8;
    c.mla.v_head_dim = 16;
  }
  moe::MoELayerConfig mc;
  mc.low = bf16 ? LowPrecision(DType::BF16) : std::nullopt;
  mc.router.hidden = 64;
  mc.router.num_experts = 4;
  mc.router.topk = 4;  // every expert: no routing decision for bf16 rounding to flip against the f32 run
  mc.router.aux_loss_coeff = {0.01};
  mc.ffn_hidden = 48;
  mc.shared_ffn_hidden = 32;
  mc.shared_expert_gate = true;
  mc.init_std = mc.output_init_std = 0.05;
  nn::FfnFactory ffn = [mc](nn::ParamRegistry& r, const std::string& name,
                            int64_t i) -> std::unique_ptr<nn::FeedForward> {
    if (i == 0) return nullptr;
    return std::make_unique<moe::MoELayer>(r, name, mc);
  };
  nn::ParamRegistry reg;
  nn::GPTModel model(c, reg, ffn);
  reg.initialize(5);
  const int64_t B = 2, S = 64;
  Tensor tokens = Tensor::empty({B, S}, DType::I64), labels = Tensor::empty({B, S}, DType::I64);
  for (int64_t i = 0; i < B * S; i++) {
    tokens.set_item(i, static_cast<double>((i * 7 + 3) % 128));
    labels.set_item(i, static_cast<double>((i * 11 + 1) % 128));
  }
  auto st = model.make_stash();
  Bf16StashRun out;
  // A first step makes what persists beyond a micro-batch (the bf16 weight copies); the second's forward is measured.
  model.forward(tokens, labels, Tensor(), st);
  model.backward(st, 1.0);
  reg.zero_grad();
  const int64_t before = Allocator::instance().stats().live_bytes;
  out.loss = model.forward(tokens, labels, Tensor(), st);
  out.stash_bytes = Allocator::instance().stats().live_bytes - before;
  if (bf16) expect_bf16_stash(st, mla);
  model.backward(st, 1.0);
  for (const auto& p : reg.all()) {
    out.grads.push_back(p->grad.clone());
    out.names.push_back(p->name);
  }
  return out;
}

TEST(Bf16Stash, DtypesHalfTheBytesAndGradientsWithinBf16OfF32) {
  for (const bool mla : {false, true}) {
    const std::string what = mla ? "MLA" : "attention";
    const Bf16StashRun f = bf16_stash_run(false, mla), h = bf16_stash_run(true, mla);
    std::printf("%s: forward leaves %lld bytes in f32, %lld in bf16\n", what.c_str(),
                static_cast<long long>(f.stash_bytes), static_cast<long long>(h.stash_bytes));
    // Statistics, ids and the router's [T, E] tensors stay f32 and the bf16 logits are the f32 run's too: a little
    // over half.
    EXPECT_LT(static_cast<double>(h.stash_bytes), 0.6 * static_cast<double>(f.stash_bytes)) << what;
    EXPECT_NEAR(h.loss, f.loss, 1e-2 * std::fabs(f.loss)) << what;
    // Each gradient within bf16 rounding of the f32 model's (8-bit mantissas, f32 accumulation), as the modules'
    // bf16 tests bound theirs (test_attention_bf16_tensors.cpp).
    ASSERT_EQ(h.grads.size(), f.grads.size());
    for (size_t i = 0; i < f.grads.size(); i++)
      EXPECT_LT(testing::max_rel_diff(h.grads[i], f.grads[i]), 5e-2) << what << " " << f.names[i];
  }
}

}  // namespace
}  // namespace moecore
