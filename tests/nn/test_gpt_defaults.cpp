// Megatron's default GPT: LayerNorm and learned absolute position embeddings. fp64 finite-difference
// gradient checks of the norm module (LayerNorm, RMSNorm, zero-centred gamma), the position table and the whole
// GPT model with them (and qk-layernorm, and no positions at all); parameter names, inits and weight-decay
// exclusions as Megatron's; the flags' defaults reaching the model.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "config_util.h"
#include "model_util.h"
#include "module_grad_util.h"
#include "moecore/kernels/elementwise.h"
#include "moecore/nn/gpt_model.h"
#include "moecore/nn/norm.h"
#include "moecore/nn/position_embedding.h"
#include "moecore/train/config/config.h"
#include "test_util.h"

namespace moecore {
namespace {

using nn::NormKind;
using nn::ParamRegistry;
using nn::PositionEmbeddingType;
using testing::fd_rel_error;
using testing::kGradTol;
using testing::randn;
using testing::operator+;

void randomize_non_normal(ParamRegistry& reg) {
  uint64_t s = 50;
  for (auto& p : reg.all())
    if (p->init.kind != nn::InitKind::Normal) p->value.copy_from(randn(p->value.shape(), DType::F64, s++, 0.5));
}

using testing::check_module;

TEST(ModuleGrad, NormKindsAndZeroCenteredGamma) {
  for (NormKind kind : {NormKind::LayerNorm, NormKind::RMSNorm})
    for (bool zc : {false, true}) {
      ParamRegistry reg(DType::F64);
      nn::Norm norm(reg, "norm", 8, nn::NormConfig{kind, 1e-6, zc});
      reg.initialize(1);
      // Megatron's names and inits: weight ones (zeros when zero-centred), LayerNorm's bias zeros; no decay.
      EXPECT_EQ(reg.all().size(), kind == NormKind::LayerNorm ? 2u : 1u);
      EXPECT_EQ(reg.get("norm.weight").value.item(3), zc ? 0.0 : 1.0);
      if (kind == NormKind::LayerNorm) {
        EXPECT_EQ(reg.get("norm.bias").value.item(3), 0.0);
      }
      for (auto& p : reg.all()) EXPECT_TRUE(p->no_weight_decay) << p->name;
      randomize_non_normal(reg);
      Tensor x = randn({3, 2, 8}, DType::F64, 2, 2.0);
      nn::Norm::Stash st;
      check_module(
          reg, x, [&] { return norm.forward(x, st); }, [&](const Tensor& dy) { return norm.backward(dy, st); },
          fmt::format("norm kind={} zero_centered={}", static_cast<int>(kind), zc));
    }
}

// Zero-centred gamma computes the same function with the weight shifted by one (Megatron's LayerNorm1P).
TEST(Module, ZeroCenteredGammaIsTheShiftedWeight) {
  ParamRegistry a(DType::F64), b(DType::F64);
  nn::Norm plain(a, "n", 8, {NormKind::LayerNorm, 1e-5, false}), onep(b, "n", 8, {NormKind::LayerNorm, 1e-5, true});
  a.initialize(1);
  b.initialize(1);
  const Tensor w = randn({8}, DType::F64, 3);
  a.get("n.weight").value.copy_from(w);
  Tensor w1 = w.clone();
  Tensor ones = Tensor::empty({8}, DType::F64);
  kernels::fill_(ones, -1.0);
  kernels::add_(w1, ones);
  b.get("n.weight").value.copy_from(w1);
  Tensor x = randn({4, 8}, DType::F64, 2);
  nn::Norm::Stash s1, s2;
  EXPECT_LT(testing::max_rel_diff(plain.forward(x, s1), onep.forward(x, s2)), 1e-14);
}

TEST(ModuleGrad, PositionEmbedding) {
  ParamRegistry reg(DType::F64);
  nn::PositionEmbedding pos(reg, "pos", 7, 4, 1.0);
  reg.initialize(1);
  Tensor x = randn({5, 2, 4}, DType::F64, 2);
  nn::PositionEmbedding::Stash st;
  check_module(
      reg, x,
      [&] {
        Tensor h = x.clone();
        pos.forward_(h, st);
        return h;
      },
      [&](const Tensor& dy) {
        pos.backward(dy, st);
        return dy.clone();  // y = x + P[pos]: dx = dy
      },
      "position embedding");
  // Rows past the sequence stay untouched.
  EXPECT_EQ(reg.get("pos.weight").grad.slice(5, 2).numel(), 8);
  EXPECT_EQ(kernels::sum_squares(reg.get("pos.weight").grad.slice(5, 2)), 0.0);
}

nn::GPTConfig defaults_gpt(bool untied, PositionEmbeddingType pos) {
  nn::GPTConfig c = testing::small_gpt({.kv_heads = 1, .vocab = 11});
  c.qk_layernorm = true;
  c.untie_embeddings_and_output_weights = untied;
  c.norm_eps = 1e-6;
  c.normalization = NormKind::LayerNorm;
  c.position_embedding = pos;
  return c;
}

TEST(ModuleGrad, GPTModelWithLayerNormAndLearnedPositions) {
  struct Case {
    bool untied;
    PositionEmbeddingType pos;
    bool zero_centered;
  };
  for (Case k :
       {Case{false, PositionEmbeddingType::LearnedAbsolute, false},
        Case{true, PositionEmbeddingType::LearnedAbsolute, true}, Case{false, PositionEmbeddingType::None, false}}) {
    ParamRegistry reg(DType::F64);
    nn::GPTConfig cfg = defaults_gpt(k.untied, k.pos);
    cfg.zero_centered_gamma = k.zero_centered;
    nn::GPTModel model(cfg, reg);
    reg.initialize(6);
    randomize_non_normal(reg);
    const int64_t B = 2, S = 5;
    Tensor tokens = testing::randint({B, S}, 11, 1), labels = testing::randint({B, S}, 11, 2);
    auto st = model.make_stash();
    auto loss = [&] { return model.forward(tokens, labels, Tensor(), st); };
    reg.zero_grad();
    loss();
    model.backward(st);
    const std::string what = fmt::format("untied={} pos={} 1p={}", k.untied, static_cast<int>(k.pos), k.zero_centered);
    for (auto& p : reg.all()) {
      // Without RoPE the key norm's bias adds the same vector to every key, which moves all of a query's scores
      // by one constant: softmax cancels it, so its gradient is zero (a finite difference cannot check zero).
      if (p->name.ends_with("k_layernorm.bias")) {
        EXPECT_LT(std::sqrt(kernels::sum_squares(p->grad)), 1e-12) << what << " " << p->name;
        continue;
      }
      // The whole model's longest product chains leave a finite-difference truncation near 1e-6 (1.03e-6 for a
      // query weight under clang -O1 in the sanitized build, below 1e-6 with g++ -O3): 2 x kGradTol here.
      EXPECT_LT(fd_rel_error(loss, p->value, p->grad, 40), 2 * kGradTol) << what << " " << p->name;
    }
  }
}

// Megatron-Core's names: embedding.position_embeddings.weight (decayed, like the word embeddings), every norm's
// weight and bias (not decayed), q/k_layernorm in the configured normalization; no position table without
// learned_absolute.
TEST(Module, GPTParameterNamesAndWeightDecay) {
  ParamRegistry reg(DType::F64);
  nn::GPTModel model(defaults_gpt(false, PositionEmbeddingType::LearnedAbsolute), reg);
  const nn::Parameter& pos = reg.get("embedding.position_embeddings.weight");
  EXPECT_EQ(pos.value.shape(), (Shape{8, 8}));  // [max positions, H]
  EXPECT_FALSE(pos.no_weight_decay);
  EXPECT_EQ(pos.init.kind, nn::InitKind::Normal);
  EXPECT_EQ(pos.init.std, 0.5);  // init_method_std
  for (const char* n :
       {"decoder.layers.0.input_layernorm", "decoder.layers.1.pre_mlp_layernorm", "decoder.final_layernorm",
        "decoder.layers.0.self_attention.q_layernorm", "decoder.layers.1.self_attention.k_layernorm"})
    for (const char* part : {".weight", ".bias"}) EXPECT_TRUE(reg.get(std::string(n) + part).no_weight_decay) << n;
  EXPECT_EQ(reg.get("decoder.layers.0.self_attention.q_layernorm.bias").value.numel(), 4);  // head dim
  ParamRegistry none(DType::F64);
  nn::GPTModel m2(defaults_gpt(false, PositionEmbeddingType::None), none);
  for (auto& p : none.all()) EXPECT_EQ(p->name.find("position"), std::string::npos) << p->name;
}

// Positions matter with learned_absolute: the same tokens at other positions give other logits; with none the
// model (causal attention without positions) sees a repeated token identically wherever the prefix is the same
// token.
TEST(Module, LearnedPositionsMakeLogitsDependOnPosition) {
  for (PositionEmbeddingType pos : {PositionEmbeddingType::LearnedAbsolute, PositionEmbeddingType::None}) {
    ParamRegistry reg(DType::F64);
    nn::GPTModel model(defaults_gpt(false, pos), reg);
    reg.initialize(3);
    Tensor tokens = Tensor::empty({1, 4}, DType::I64);
    for (int64_t i = 0; i < 4; i++) tokens.set_item(i, 5);
    const Tensor l = model.logits(tokens);  // [4, V]
    double diff = 0;
    for (int64_t v = 0; v < l.cols(); v++) diff = std::max(diff, std::fabs(l.item(v) - l.item(3 * l.cols() + v)));
    if (pos == PositionEmbeddingType::None)
      EXPECT_LT(diff, 1e-12);
    else
      EXPECT_GT(diff, 1e-3);
  }
}

// Without --normalization and --position-embedding-type a model is Megatron's default: LayerNorm, learned_absolute.
TEST(TrainConfig, MegatronDefaultsReachTheModel) {
  const train::TrainConfig c =
      testing::small_config({"--num-layers", "1", "--hidden-size", "16", "--num-attention-heads", "2"},
                            testing::mock_run_flags(8, 1, 1, 32, 1, "1e-3"));
  EXPECT_EQ(c.normalization, "LayerNorm");
  EXPECT_EQ(c.position_embedding_type, "learned_absolute");
  const nn::GPTConfig g = train::gpt_config(c, 128);
  EXPECT_EQ(g.normalization, NormKind::LayerNorm);
  EXPECT_EQ(g.position_embedding, PositionEmbeddingType::LearnedAbsolute);
  const train::TrainConfig r =
      testing::small_config(testing::tiny_moe_flags() + testing::mock_run_flags(8, 1, 1, 32, 1, "1e-3"));
  EXPECT_EQ(train::gpt_config(r, 128).normalization, NormKind::RMSNorm);
  const train::TrainConfig p =
      testing::small_config({"--model", "qwen3-moe"}, testing::mock_run_flags(8, 1, 1, 32, 1, "1e-3"));
  EXPECT_EQ(p.normalization, "RMSNorm");  // the presets are Qwen3/Mixtral/DeepSeek-like models
  EXPECT_EQ(p.position_embedding_type, "rope");
}

}  // namespace
}  // namespace moecore
