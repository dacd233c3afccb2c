// The dense GPT end to end: initialization rules, a copy task learned to near-zero loss, a steady-state step that
// allocates nothing and creates no GEMM primitive, bitwise-repeatable runs, and bf16 against f32.
#include <gtest/gtest.h>

#include <cmath>
#include <tuple>
#include <vector>

#include "copy_task.h"
#include "model_util.h"
#include "moecore/core/allocator.h"
#include "moecore/kernels/adamw_update.h"
#include "moecore/kernels/gemm.h"
#include "moecore/nn/gpt_model.h"
#include "test_util.h"

namespace moecore {
namespace {

using testing::copy_batch;
using testing::copy_config;
using testing::CopyBatch;
using testing::Trainer;

double sample_std(const Tensor& t) {
  double s = 0, s2 = 0;
  for (int64_t i = 0; i < t.numel(); i++) {
    s += t.item(i);
    s2 += t.item(i) * t.item(i);
  }
  const double n = static_cast<double>(t.numel()), m = s / n;
  return std::sqrt(s2 / n - m * m);
}

TEST(GPTInit, MegatronRules) {
  const nn::GPTConfig c = testing::small_gpt({.layers = 4,
                                              .hidden = 128,
                                              .ffn = 256,
                                              .heads = 4,
                                              .kv_heads = 4,
                                              .head_dim = 32,
                                              .vocab = 512,
                                              .max_seq = 128,
                                              .init_std = 0.02});
  nn::ParamRegistry reg;
  nn::GPTModel model(c, reg);
  reg.initialize(1234);
  const double out_std = 0.02 / std::sqrt(8.0);
  EXPECT_NEAR(sample_std(reg.get("decoder.layers.0.self_attention.linear_q.weight").value), 0.02, 0.02 * 0.05);
  EXPECT_NEAR(sample_std(reg.get("decoder.layers.1.mlp.linear_fc1.weight").value), 0.02, 0.02 * 0.05);
  EXPECT_NEAR(sample_std(reg.get("embedding.word_embeddings.weight").value), 0.02, 0.02 * 0.05);
  EXPECT_NEAR(sample_std(reg.get("decoder.layers.2.self_attention.linear_proj.weight").value), out_std, out_std * 0.05);
  EXPECT_NEAR(sample_std(reg.get("decoder.layers.3.mlp.linear_fc2.weight").value), out_std, out_std * 0.05);
  const Tensor& norm = reg.get("decoder.final_layernorm.weight").value;
  for (int64_t i = 0; i < norm.numel(); i++) EXPECT_EQ(norm.item(i), 1.0);
  EXPECT_TRUE(reg.get("decoder.layers.0.input_layernorm.weight").no_weight_decay);
  EXPECT_FALSE(reg.get("decoder.layers.0.mlp.linear_fc2.weight").no_weight_decay);
  // Same seed, same values; another seed, others.
  nn::ParamRegistry reg2;
  nn::GPTModel model2(c, reg2);
  reg2.initialize(1234);
  EXPECT_TRUE(testing::bitwise_equal(reg.get("decoder.layers.1.mlp.linear_fc1.weight").value,
                                     reg2.get("decoder.layers.1.mlp.linear_fc1.weight").value));
  reg2.initialize(1235);
  EXPECT_FALSE(testing::bitwise_equal(reg.get("decoder.layers.1.mlp.linear_fc1.weight").value,
                                      reg2.get("decoder.layers.1.mlp.linear_fc1.weight").value));
}

TEST(GPTTrain, LearnsCopyTask) {
  Trainer t(copy_config());
  t.decay_steps = 600;
  const int64_t B = 16, half = 8;
  double first = 0, last = 0;
  for (int s = 0; s < 600; s++) {
    const double loss = t.train_step(copy_batch(B, half, 16, s));
    if (s == 0) first = loss;
    last = loss;
    if (s >= 50 && loss < 0.01) break;
  }
  EXPECT_NEAR(first, std::log(16.0), 0.3) << "an untrained model predicts uniformly";
  EXPECT_LT(last, 0.05) << "the copy task must be learned";
  // Held-out batch, greedy predictions of the copied half are exact.
  CopyBatch test = copy_batch(8, half, 16, 100000);
  Tensor logits = t.model.logits(test.tokens);
  int correct = 0, total = 0;
  const int64_t S = test.tokens.dim(1);
  for (int64_t b = 0; b < 8; b++)
    for (int64_t s = half - 1; s < S; s++) {
      const int64_t row = s * 8 + b;
      int64_t best = 0;
      for (int64_t vv = 1; vv < 16; vv++)
        if (logits.item(row * 16 + vv) > logits.item(row * 16 + best)) best = vv;
      correct += best == test.labels.data<int64_t>()[b * S + s];
      total++;
    }
  EXPECT_GE(correct, total * 99 / 100) << correct << "/" << total;
}

TEST(GPTTrain, SteadyStateStepAllocatesNothingAndCreatesNoPrimitive) {
  Trainer t(copy_config());
  CopyBatch b = copy_batch(4, 8, 16, 0);
  t.train_step(b);
  t.train_step(b);
  const AllocatorMark mark = Allocator::instance().mark();
  const int64_t prims = kernels::gemm_stats().primitives_created;
  t.train_step(b);
  t.train_step(b);
  EXPECT_EQ(Allocator::instance().system_allocs_since(mark), 0);
  EXPECT_GT(Allocator::instance().requests_since(mark), 0) << "the check must see the step's tensors";
  EXPECT_EQ(kernels::gemm_stats().primitives_created, prims);
}

TEST(GPTTrain, TwoRunsAreBitwiseEqual) {
  std::vector<double> losses[2];
  for (int r = 0; r < 2; r++) {
    Trainer t(copy_config());
    for (int s = 0; s < 5; s++) losses[r].push_back(t.train_step(copy_batch(4, 8, 16, s)));
  }
  for (int s = 0; s < 5; s++) EXPECT_EQ(losses[0][s], losses[1][s]) << "step " << s;
}

// bf16 GEMM operands: losses track f32 within 1% over the first steps (8-bit mantissas; f32 accumulation).
TEST(GPTTrain, Bf16TracksF32) {
  nn::GPTConfig c = copy_config();
  Trainer f32(c);
  c.low = DType::BF16;
  Trainer b16(c);
  for (int s = 0; s < 10; s++) {
    CopyBatch b = copy_batch(8, 8, 16, s);
    const double lf = f32.train_step(b), lb = b16.train_step(b);
    EXPECT_NEAR(lb, lf, 0.01 * lf) << "step " << s;
  }
}

// One forward and backward_scaled(0.5 / loss tokens) of a fresh model: the loss and every parameter's gradient, with
// the scale given to forward (fused) or not; checks that forward computed the logits' gradients (main and MTP) when
// it had the scale, and consumed it.
struct LossGradRun {
  double loss = 0;
  std::vector<Tensor> grads;
};
LossGradRun loss_grad_run(const nn::GPTConfig& c, const Tensor& tokens, const Tensor& labels, const Tensor& mask,
                          bool fused) {
  nn::ParamRegistry reg;
  nn::GPTModel model(c, reg);
  reg.initialize(7);
  reg.zero_grad();
  nn::GPTModel::Stash st = model.make_stash();
  if (fused) st.token_scale_of = [](double mask_sum) { return 0.5 / mask_sum; };
  LossGradRun r;
  r.loss = model.forward(tokens, labels, mask, st);
  EXPECT_EQ(st.grad_token_scale >= 0, fused);
  for (const auto& d : st.mtp.depths) EXPECT_EQ(d.grad_scale >= 0, fused);
  EXPECT_FALSE(st.token_scale_of) << "forward consumes the scale";
  model.backward_scaled(st, 0.5 / st.mask_sum, 1.0);
  for (const auto& p : reg.all()) r.grads.push_back(p->grad.clone());
  return r;
}

// A schedule that knows the backward's token scale before forward (Stash::token_scale_of) gets the logits' gradient
// from the loss's forward (one pass over the logits): the loss and every parameter gradient as the separate backward
// gives them, up to rounding (MTP's depths too); the scale is checked in backward; a forward without it computes no
// gradient.
TEST(GPTLossGradient, ComputedInForwardWhenTheScaleIsKnown) {
  nn::GPTConfig mtp = testing::small_gpt({.vocab = 16, .max_seq = 16});
  mtp.mtp.num_layers = 2;
  mtp.mtp.loss_scaling_factor = 0.3;
  nn::GPTConfig bf16 = copy_config();
  bf16.low = DType::BF16;
  const CopyBatch b = copy_batch(4, 8, 16, 3);
  for (const auto& [name, c, tol] :
       {std::tuple{"f32", copy_config(), 1e-4}, {"bf16", bf16, 2e-2}, {"MTP", mtp, 1e-4}}) {
    SCOPED_TRACE(name);
    const LossGradRun want = loss_grad_run(c, b.tokens, b.labels, b.mask, false);
    const LossGradRun got = loss_grad_run(c, b.tokens, b.labels, b.mask, true);
    EXPECT_NEAR(got.loss, want.loss, 1e-6 * want.loss);
    for (size_t i = 0; i < want.grads.size(); i++)
      EXPECT_LT(testing::max_rel_diff(got.grads[i], want.grads[i]), tol) << "parameter " << i;
  }
  // Another scale in backward than forward used is an internal error, not a silently wrong gradient.
  nn::ParamRegistry reg;
  nn::GPTModel model(copy_config(), reg);
  reg.initialize(7);
  nn::GPTModel::Stash st = model.make_stash();
  st.token_scale_of = [](double mask_sum) { return 1.0 / mask_sum; };
  model.forward(b.tokens, b.labels, b.mask, st);
  EXPECT_THROW(model.backward_scaled(st, 0.5 / st.mask_sum, 1.0), std::exception);
}

}  // namespace
}  // namespace moecore
