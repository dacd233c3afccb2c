// Hidden and attention dropout in the modules: fp64 finite-difference checks with both dropouts on (fixed masks:
// the same seed and sample indices in every evaluation), and dropout only in training.
#include <gtest/gtest.h>

#include "model_util.h"
#include "moecore/kernels/elementwise.h"
#include "moecore/nn/gpt_model.h"
#include "moecore/nn/mlp.h"
#include "moecore/nn/transformer_layer.h"
#include "test_util.h"

namespace moecore {
namespace {

using nn::ParamRegistry;
using testing::fd_rel_error;
using testing::kGradTol;
using testing::randn;

nn::AttentionConfig attention_with_dropout(double p) {
  nn::AttentionConfig c;
  c.hidden = 8;
  c.num_heads = 4;
  c.num_query_groups = 2;
  c.head_dim = 4;
  c.max_seq_len = 16;
  c.qk_layernorm = true;
  c.init_std = 0.4;
  c.output_init_std = 0.3;
  c.norm_eps = 1e-6;
  c.attention_dropout = p;
  return c;
}

struct Layer {
  ParamRegistry reg{DType::F64};
  std::unique_ptr<nn::TransformerLayer> layer;
  explicit Layer(double hidden, double attention) {
    auto mlp = std::make_unique<nn::MLP>(
        reg, "layer.mlp", nn::MLPConfig{8, 12, kernels::Activation::SwiGLU, false, 0.4, 0.3, std::nullopt, {}});
    layer = std::make_unique<nn::TransformerLayer>(reg, "layer", attention_with_dropout(attention),
                                                   nn::NormConfig{nn::NormKind::RMSNorm, 1e-6}, std::move(mlp), hidden);
    reg.initialize(5);
  }
};

TEST(DropoutGrad, TransformerLayerWithBothDropouts) {
  Layer l(0.2, 0.2);
  Tensor x = randn({6, 2, 8}, DType::F64, 2);
  auto st = l.layer->make_stash();
  st.dropout = nn::DropoutBatch{true, 9, {31, 4}, {}};
  auto fwd = [&] { return l.layer->forward(x, st); };
  Tensor W = randn({6, 2, 8}, DType::F64, 99);
  auto loss = [&] { return kernels::dot(fwd(), W); };
  l.reg.zero_grad();
  fwd();
  Tensor dx = l.layer->backward(W, st);
  EXPECT_LT(fd_rel_error(loss, x, dx, 200), kGradTol) << "input";
  for (auto& p : l.reg.all()) EXPECT_LT(fd_rel_error(loss, p->value, p->grad, 60), kGradTol) << p->name;

  // Outside training, or at p = 0, the layer computes what a layer without dropout computes; in training the
  // masks change the output, and another sample index changes it again.
  Layer plain(0, 0);
  auto st0 = plain.layer->make_stash();
  const Tensor y0 = plain.layer->forward(x, st0).clone();
  const Tensor y_train = fwd().clone();
  st.dropout.training = false;
  EXPECT_TRUE(testing::bitwise_equal(fwd(), y0));
  st.dropout = nn::DropoutBatch{true, 9, {31, 5}, {}};
  const Tensor y_other = fwd().clone();
  EXPECT_GT(testing::max_rel_diff(y_train, y0), 1e-3);
  EXPECT_GT(testing::max_rel_diff(y_other, y_train), 1e-3);
}

TEST(DropoutGrad, GPTModelWithDropouts) {
  nn::GPTConfig c = testing::small_gpt({.kv_heads = 1, .vocab = 11});
  c.norm_eps = 1e-6;
  c.hidden_dropout = 0.15;
  c.attention_dropout = 0.25;
  c.seed = 17;
  ParamRegistry reg(DType::F64);
  nn::GPTModel model(c, reg);
  reg.initialize(6);
  const int64_t B = 2, S = 5;
  Tensor tokens = testing::randint({B, S}, 11, 1), labels = testing::randint({B, S}, 11, 2);
  auto st = model.make_stash();
  st.sample_B = {40, 41};
  auto loss = [&] { return model.forward(tokens, labels, Tensor(), st); };
  reg.zero_grad();
  const double l_train = loss();
  model.backward(st);
  for (auto& p : reg.all()) EXPECT_LT(fd_rel_error(loss, p->value, p->grad, 40), kGradTol) << p->name;

  // Evaluation mode drops nothing: the loss of the same weights without dropout.
  c.hidden_dropout = c.attention_dropout = 0;
  ParamRegistry reg0(DType::F64);
  nn::GPTModel plain(c, reg0);
  reg0.initialize(6);
  auto st0 = plain.make_stash();
  const double l_plain = plain.forward(tokens, labels, Tensor(), st0);
  model.set_training(false);
  EXPECT_EQ(model.forward(tokens, labels, Tensor(), st), l_plain);
  model.set_training(true);
  EXPECT_NE(l_train, l_plain);
  EXPECT_EQ(loss(), l_train);  // same samples, same masks
}

}  // namespace
}  // namespace moecore
