// fp64 finite-difference gradient checks of every nn module, for the input and every parameter.
#include <gtest/gtest.h>

#include "model_util.h"
#include "module_grad_util.h"
#include "moecore/kernels/elementwise.h"
#include "moecore/nn/gpt_model.h"
#include "moecore/nn/linear.h"
#include "moecore/nn/mlp.h"
#include "moecore/nn/rmsnorm_layer.h"
#include "moecore/nn/self_attention.h"
#include "moecore/nn/transformer_layer.h"
#include "moecore/nn/vocab_embedding.h"
#include "test_util.h"

namespace moecore {
namespace {

using nn::ParamRegistry;
using testing::fd_rel_error;
using testing::kGradTol;
using testing::randn;

using testing::check_module;

TEST(ModuleGrad, LinearWithAndWithoutBias) {
  for (bool bias : {false, true}) {
    ParamRegistry reg(DType::F64);
    nn::Linear lin(reg, "lin", nn::LinearConfig{6, 4, bias, nn::InitRule::normal(0.5), std::nullopt});
    reg.initialize(1);
    if (bias) reg.get("lin.bias").value.copy_from(randn({4}, DType::F64, 5));
    Tensor x = randn({5, 6}, DType::F64, 2);
    nn::Linear::Stash st;
    check_module(
        reg, x, [&] { return lin.forward(x, st); }, [&](const Tensor& dy) { return lin.backward(dy, st); },
        bias ? "linear+bias" : "linear");
  }
}

TEST(ModuleGrad, Embedding) {
  ParamRegistry reg(DType::F64);
  nn::Embedding emb(reg, "emb", 9, 4, 1.0);
  reg.initialize(1);
  Tensor ids = testing::randint({7}, 9, 3);
  nn::Embedding::Stash st;
  Tensor none;
  check_module(
      reg, none, [&] { return emb.forward(ids, st); },
      [&](const Tensor& dy) {
        emb.backward(dy, st);
        return Tensor();
      },
      "embedding");
}

TEST(ModuleGrad, RMSNorm) {
  ParamRegistry reg(DType::F64);
  nn::RMSNorm norm(reg, "norm", 8, 1e-6);
  reg.get("norm.weight").value.copy_from(randn({8}, DType::F64, 4));
  Tensor x = randn({3, 2, 8}, DType::F64, 2);
  nn::RMSNorm::Stash st;
  check_module(
      reg, x, [&] { return norm.forward(x, st); }, [&](const Tensor& dy) { return norm.backward(dy, st); }, "rmsnorm");
}

nn::AttentionConfig small_attention(bool qk_norm, double rotary_percent, int64_t groups) {
  nn::AttentionConfig c;
  c.hidden = 8;
  c.num_heads = 4;
  c.num_query_groups = groups;
  c.head_dim = 4;
  c.max_seq_len = 16;
  c.rotary_percent = rotary_percent;
  c.qk_layernorm = qk_norm;
  c.init_std = 0.4;
  c.output_init_std = 0.3;
  c.norm_eps = 1e-6;
  return c;
}

void randomize_norms(ParamRegistry& reg) {
  uint64_t s = 50;
  for (auto& p : reg.all())
    if (p->init.kind != nn::InitKind::Normal) p->value.copy_from(randn(p->value.shape(), DType::F64, s++, 0.5));
}

TEST(ModuleGrad, AttentionVariants) {
  struct Case {
    bool qk_norm;
    double rot;
    int64_t groups;
    bool bias;
  };
  for (Case c : {Case{false, 1.0, 4, false}, Case{true, 1.0, 2, false}, Case{false, 0.5, 1, true}}) {
    ParamRegistry reg(DType::F64);
    nn::AttentionConfig ac = small_attention(c.qk_norm, c.rot, c.groups);
    ac.bias = c.bias;
    nn::Attention attn(reg, "attn", ac);
    reg.initialize(3);
    randomize_norms(reg);
    Tensor x = randn({5, 2, 8}, DType::F64, 2);
    nn::Attention::Stash st;
    check_module(
        reg, x, [&] { return attn.forward(x, st); }, [&](const Tensor& dy) { return attn.backward(dy, st); },
        fmt::format("attention qk_norm={} rot={} groups={}", c.qk_norm, c.rot, c.groups));
  }
}

TEST(ModuleGrad, MLPActivations) {
  for (auto act : {kernels::Activation::SwiGLU, kernels::Activation::GeLU, kernels::Activation::SquaredReLU}) {
    ParamRegistry reg(DType::F64);
    nn::MLP mlp(reg, "mlp", nn::MLPConfig{6, 10, act, true, 0.4, 0.3, std::nullopt, {}});
    reg.initialize(4);
    randomize_norms(reg);
    Tensor x = randn({3, 2, 6}, DType::F64, 2);
    auto st = mlp.make_stash();
    check_module(
        reg, x, [&] { return mlp.forward(x, *st); }, [&](const Tensor& dy) { return mlp.backward(dy, *st); },
        std::string("mlp ") + std::string(kernels::activation_name(act)));
  }
}

TEST(ModuleGrad, TransformerLayer) {
  ParamRegistry reg(DType::F64);
  nn::AttentionConfig ac = small_attention(true, 1.0, 2);
  auto mlp = std::make_unique<nn::MLP>(
      reg, "layer.mlp", nn::MLPConfig{8, 12, kernels::Activation::SwiGLU, false, 0.4, 0.3, std::nullopt, {}});
  nn::TransformerLayer layer(reg, "layer", ac, nn::NormConfig{nn::NormKind::RMSNorm, 1e-6}, std::move(mlp));
  reg.initialize(5);
  randomize_norms(reg);
  Tensor x = randn({6, 2, 8}, DType::F64, 2);
  auto st = layer.make_stash();
  check_module(
      reg, x, [&] { return layer.forward(x, st); }, [&](const Tensor& dy) { return layer.backward(dy, st); },
      "transformer layer");
}

nn::GPTConfig tiny_gpt(bool untied) {
  nn::GPTConfig c = testing::small_gpt({.kv_heads = 1, .vocab = 11});
  c.qk_layernorm = true;
  c.untie_embeddings_and_output_weights = untied;
  c.norm_eps = 1e-6;
  return c;
}

TEST(ModuleGrad, GPTModelTiedAndUntied) {
  for (bool untied : {false, true}) {
    ParamRegistry reg(DType::F64);
    nn::GPTModel model(tiny_gpt(untied), reg);
    reg.initialize(6);
    randomize_norms(reg);
    const int64_t B = 2, S = 5;
    Tensor tokens = testing::randint({B, S}, 11, 1), labels = testing::randint({B, S}, 11, 2);
    Tensor mask = Tensor::empty({B, S}, DType::F64);
    for (int64_t i = 0; i < B * S; i++) mask.set_item(i, i % 3 == 0 ? 0.0 : 1.0);
    auto st = model.make_stash();
    auto loss = [&] { return model.forward(tokens, labels, mask, st); };
    reg.zero_grad();
    loss();
    model.backward(st);
    for (auto& p : reg.all())
      EXPECT_LT(fd_rel_error(loss, p->value, p->grad, 40), kGradTol) << (untied ? "untied " : "tied ") << p->name;
  }
}

}  // namespace
}  // namespace moecore
