// Linear biases in an MoE layer (Megatron's default --add-bias-linear): the router's gating bias and the experts'
// fc1 and fc2 biases, y = fc2(act(fc1·x + b1) ⊙ p) + b2·p. The per-segment bias kernels against Megatron's published
// _apply_bias case and fp64 finite differences; the experts' forward against a case computed by hand; fp64
// finite-difference gradients of the experts and of a whole MoE layer; bf16 against f32; names, counts and optimizer
// rules of the new parameters. Training with biases: tests/moe/test_expert_biases_train.cpp.
#include <gtest/gtest.h>

#include "model_util.h"
#include "moecore/kernels/elementwise.h"
#include "moecore/moe/moe_layer.h"
#include "moecore/optim/muon.h"
#include "test_util.h"

namespace moecore {
namespace {

using testing::fd_rel_error;
using testing::kGradTol;
using testing::randn;

Tensor from_values(const Shape& s, DType dt, const std::vector<double>& v) {
  Tensor t = Tensor::empty(s, dt);
  EXPECT_EQ(t.numel(), static_cast<int64_t>(v.size()));
  for (int64_t i = 0; i < t.numel(); i++) t.set_item(i, v[static_cast<size_t>(i)]);
  return t;
}

void expect_values(const Tensor& t, const std::vector<double>& want, double tol, const std::string& what) {
  ASSERT_EQ(t.numel(), static_cast<int64_t>(want.size())) << what;
  for (int64_t i = 0; i < t.numel(); i++) EXPECT_NEAR(t.item(i), want[static_cast<size_t>(i)], tol) << what << " " << i;
}

// Megatron's tests/unit_tests/transformer/moe/test_grouped_mlp.py (_apply_bias): rows [[1,2],[3,4],[5,6]], two
// experts of 2 and 1 rows with biases [10,20] and [100,200], probabilities [.5,.5,1] -> [[6,12],[8,14],[105,206]].
// Here the second expert's row sits after a gap (the CPU experts' padded layout): the gap rows are left alone.
TEST(SegmentBias, MegatronApplyBiasCase) {
  for (DType dt : {DType::F32, DType::F64}) {
    Tensor y = from_values({5, 2}, dt, {1, 2, 3, 4, -7, -8, 5, 6, -9, -10});
    const Tensor b = from_values({2, 2}, dt, {10, 20, 100, 200}), p = from_values({5}, dt, {.5, .5, 0, 1, 0});
    const std::vector<int64_t> begin{0, 3}, count{2, 1};
    kernels::segment_bias_forward(b, &p, {begin, count}, y);
    expect_values(y, {6, 12, 8, 14, -7, -8, 105, 206, -9, -10}, 0, "y");
  }
  // Without weights the plain bias, bitwise what add_row_bias_ adds.
  Tensor y = randn({7, 5}, DType::F32, 1), y2 = y.clone();
  const Tensor b = randn({1, 5}, DType::F32, 2);
  const std::vector<int64_t> begin{0}, count{7};
  kernels::segment_bias_forward(b, nullptr, {begin, count}, y);
  kernels::add_row_bias_(y2, b.reshape({5}));
  EXPECT_TRUE(testing::bitwise_equal(y, y2));
}

// The backward is the forward's adjoint: fp64 finite differences of L = <y, W> for the bias and the row weights,
// over segments with an empty one and gap rows, and 70 columns (two column blocks).
TEST(SegmentBias, BackwardMatchesFiniteDifferences) {
  const int64_t N = 70, R = 12;
  const std::vector<int64_t> begin{0, 4, 4, 9}, count{3, 0, 5, 2};
  Tensor b = randn({4, N}, DType::F64, 3), w = randn({R}, DType::F64, 4);
  const Tensor y0 = randn({R, N}, DType::F64, 5), W = randn({R, N}, DType::F64, 6);
  auto loss = [&] {
    Tensor y = y0.clone();
    kernels::segment_bias_forward(b, &w, {begin, count}, y);
    return kernels::dot(y, W);
  };
  Tensor db = Tensor::zeros({4, N}, DType::F64), dw = Tensor::zeros({R}, DType::F64);
  kernels::segment_bias_backward(W, &w, {begin, count}, db, &b, &dw);
  EXPECT_LT(fd_rel_error(loss, b, db), kGradTol);
  EXPECT_LT(fd_rel_error(loss, w, dw), kGradTol);
  EXPECT_EQ(dw.item(3), 0.0) << "a gap row has no gradient";
  EXPECT_EQ(kernels::sum_squares(db.slice(1, 1)), 0.0) << "an empty segment has no gradient";
}

// bf16 rows are read widened: the same bits as their f32 copy.
TEST(SegmentBias, Bf16RowsReadWidened) {
  const int64_t N = 33, R = 9;
  const std::vector<int64_t> begin{0, 4}, count{4, 5};
  const Tensor dy16 = randn({R, N}, DType::F32, 7).to(DType::BF16), dy = dy16.to(DType::F32);
  const Tensor w = randn({R}, DType::F32, 8), b = randn({2, N}, DType::F32, 9);
  Tensor db_a = Tensor::zeros({2, N}, DType::F32), db_b = db_a.clone(), dw_a = Tensor::zeros({R}, DType::F32),
         dw_b = dw_a.clone();
  kernels::segment_bias_backward(dy16, &w, {begin, count}, db_a, &b, &dw_a);
  kernels::segment_bias_backward(dy, &w, {begin, count}, db_b, &b, &dw_b);
  EXPECT_TRUE(testing::bitwise_equal(db_a, db_b));
  EXPECT_TRUE(testing::bitwise_equal(dw_a, dw_b));
  // Adding into bf16 rows computes in f32 and rounds once.
  Tensor y16 = dy16.clone(), y = dy.clone();
  kernels::segment_bias_forward(b, &w, {begin, count}, y16);
  kernels::segment_bias_forward(b, &w, {begin, count}, y);
  EXPECT_TRUE(testing::bitwise_equal(y16, y.to(DType::BF16)));
}

moe::ExpertsConfig experts_config(int64_t H, int64_t F, int64_t E, kernels::Activation act, bool bf16 = false) {
  moe::ExpertsConfig c{H, F, E, 0, act, 0.3, 0.3, bf16 ? LowPrecision(DType::BF16) : std::nullopt};
  c.bias = true;
  return c;
}

// Two experts, H = F = 2, squared ReLU, by hand from y = W2·(relu(W1·x + b1)² · p) + b2·p:
//   expert 0: W1 = I, b1 = [1, −1], W2 = [[1, 1], [0, 2]], b2 = [10, 20]
//   expert 1: W1 = [[1, 1], [1, −1]], b1 = [0, 2], W2 = [[2, 0], [1, 1]], b2 = [100, 200]
//   row 0 (expert 0, p .5):  x = [1, 2]:  h = [2, 1],  a = [4, 1]·.5 = [2, .5], y = [2.5, 1] + [5, 10]  = [7.5, 11]
//   row 1 (expert 0, p 1):   x = [3, −2]: h = [4, −3], a = [16, 0],         y = [16, 0] + [10, 20]  = [26, 20]
//   row 2 (expert 1, p .25): x = [1, 1]:  h = [2, 2],  a = [4, 4]·.25 = [1, 1], y = [2, 2] + [25, 50] = [27, 52]
TEST(GroupedExpertsBias, ForwardComputedByHand) {
  for (DType dt : {DType::F64, DType::F32}) {
    nn::ParamRegistry reg(dt);
    moe::GroupedExperts ex(reg, "experts", experts_config(2, 2, 2, kernels::Activation::SquaredReLU));
    ex.fc1().value.copy_from(from_values({2, 2, 2}, dt, {1, 0, 0, 1, 1, 1, 1, -1}));
    ex.fc2().value.copy_from(from_values({2, 2, 2}, dt, {1, 1, 0, 2, 2, 0, 1, 1}));
    ex.fc1_bias()->value.copy_from(from_values({2, 2}, dt, {1, -1, 0, 2}));
    ex.fc2_bias()->value.copy_from(from_values({2, 2}, dt, {10, 20, 100, 200}));
    const Tensor x = from_values({3, 2}, dt, {1, 2, 3, -2, 1, 1}), p = from_values({3}, dt, {.5, 1, .25});
    moe::GroupedExperts::Stash st;
    const std::vector<int64_t> counts{2, 1};
    expect_values(ex.forward(x, p, counts, st), {7.5, 11, 26, 20, 27, 52}, 1e-5, std::string(dtype_name(dt)));
    const Tensor b1 = ex.fc1_bias()->value, b2 = ex.fc2_bias()->value;
    expect_values(moe::sequential_experts_forward(ex.fc1().value, ex.fc2().value, kernels::Activation::SquaredReLU, x,
                                                  p, counts, &b1, &b2),
                  {7.5, 11, 26, 20, 27, 52}, 1e-12, "the sequential reference");
  }
}

void randomize(nn::Parameter& p, uint64_t stream, double std) {
  p.value.copy_from(randn(p.value.shape(), p.value.dtype(), stream, std));
}

// fp64 finite differences of L = <y, W> for the inputs, probabilities, weights and biases, for every activation,
// with experts that get no rows (whose biases then get no gradient).
TEST(GroupedExpertsBias, FiniteDifferences) {
  for (auto act : {kernels::Activation::SwiGLU, kernels::Activation::GeLU, kernels::Activation::SquaredReLU}) {
    const int64_t H = 6, F = 5, E = 4;
    const std::vector<int64_t> counts{3, 0, 5, 2};
    const int64_t R = 10;
    nn::ParamRegistry reg(DType::F64);
    moe::GroupedExperts ex(reg, "experts", experts_config(H, F, E, act));
    reg.initialize(3);
    randomize(*ex.fc1_bias(), 21, 0.3);
    randomize(*ex.fc2_bias(), 22, 0.3);
    Tensor x = randn({R, H}, DType::F64, 1), p = randn({R}, DType::F64, 2, 0.5);
    const Tensor W = randn({R, H}, DType::F64, 4);
    moe::GroupedExperts::Stash st;
    auto loss = [&] {
      moe::GroupedExperts::Stash s;
      return kernels::dot(ex.forward(x, p, counts, s), W);
    };
    const Tensor y = ex.forward(x, p, counts, st);
    const Tensor b1 = ex.fc1_bias()->value, b2 = ex.fc2_bias()->value;
    EXPECT_LT(testing::max_rel_diff(
                  y, moe::sequential_experts_forward(ex.fc1().value, ex.fc2().value, act, x, p, counts, &b1, &b2)),
              1e-13);
    reg.zero_grad();
    Tensor dp;
    const Tensor dx = ex.backward(W, st, dp);
    const std::string name(kernels::activation_name(act));
    EXPECT_LT(fd_rel_error(loss, x, dx), kGradTol) << name << ": x";
    EXPECT_LT(fd_rel_error(loss, p, dp), kGradTol) << name << ": probs";
    for (auto& q : reg.all()) EXPECT_LT(fd_rel_error(loss, q->value, q->grad), kGradTol) << name << ": " << q->name;
    EXPECT_EQ(kernels::sum_squares(ex.fc1_bias()->grad.slice(1, 1)), 0.0) << name;
    EXPECT_EQ(kernels::sum_squares(ex.fc2_bias()->grad.slice(1, 1)), 0.0) << name;
  }
}

// Under bf16 on the CPU fc1's output stays f32 with a bias (the bias added before any rounding), fc2's bf16 rows take
// b2·p as Megatron's _apply_bias does: close to the f32 experts, and moe_act recompute gives the same bits.
TEST(GroupedExpertsBias, Bf16CloseToF32AndRecomputeBitwise) {
  const int64_t H = 64, F = 48, E = 3;
  const std::vector<int64_t> counts{40, 0, 33};
  const int64_t R = 73;
  struct Out {
    Tensor y, dx, dp, db1, db2;
  };
  auto run = [&](bool bf16, bool recompute) {
    nn::ParamRegistry reg(DType::F32);
    moe::ExpertsConfig c = experts_config(H, F, E, kernels::Activation::SwiGLU, bf16);
    c.recompute_act = recompute;
    moe::GroupedExperts ex(reg, "experts", c);
    reg.initialize(5);
    randomize(*ex.fc1_bias(), 31, 0.5);
    randomize(*ex.fc2_bias(), 32, 0.5);
    reg.zero_grad();
    moe::GroupedExperts::Stash st;
    Out o;
    o.y = ex.forward(randn({R, H}, DType::F32, 1), randn({R}, DType::F32, 2), counts, st).to(DType::F32);
    o.dx = ex.backward(randn({R, H}, DType::F32, 3), st, o.dp).to(DType::F32);
    o.db1 = ex.fc1_bias()->grad.clone();
    o.db2 = ex.fc2_bias()->grad.clone();
    return o;
  };
  const Out f32 = run(false, false), b16 = run(true, false), b16r = run(true, true);
  EXPECT_LT(testing::max_rel_diff(b16.y, f32.y), 2e-2);
  EXPECT_LT(testing::max_rel_diff(b16.dx, f32.dx), 2e-2);
  EXPECT_LT(testing::max_rel_diff(b16.dp, f32.dp), 2e-2);
  EXPECT_LT(testing::max_rel_diff(b16.db1, f32.db1), 2e-2);
  EXPECT_LT(testing::max_rel_diff(b16.db2, f32.db2), 2e-2);
  const std::pair<const Tensor*, const Tensor*> same[] = {
      {&b16.y, &b16r.y}, {&b16.dx, &b16r.dx}, {&b16.dp, &b16r.dp}, {&b16.db1, &b16r.db1}, {&b16.db2, &b16r.db2}};
  for (const auto& [a, b] : same) EXPECT_TRUE(testing::bitwise_equal(*a, *b));
}

moe::MoELayerConfig biased_layer(int64_t H, int64_t E, int64_t K) {
  moe::MoELayerConfig c = testing::fd_moe_layer(H, E, K);
  c.router.load_balancing = {moe::LoadBalancingType::AuxLoss};
  c.router.aux_loss_coeff = {0.3};
  c.router.z_loss_coeff = 0.05;
  c.bias = true;
  return c;
}

// The whole layer (router with its gating bias, dispatcher in the experts' padded layout, experts with biases): fp64
// finite differences of <y, W> + aux losses for every parameter and the input.
TEST(MoELayerBias, WholeLayerFiniteDifferences) {
  for (auto act : {kernels::Activation::SwiGLU, kernels::Activation::GeLU}) {
    moe::MoELayerConfig c = biased_layer(8, 4, 2);
    c.activation = act;
    nn::ParamRegistry reg(DType::F64);
    moe::MoELayer layer(reg, "mlp", c);
    reg.initialize(11);
    randomize(*layer.experts().fc1_bias(), 41, 0.3);
    randomize(*layer.experts().fc2_bias(), 42, 0.3);
    const int64_t S = 3, B = 2, H = 8;
    Tensor x = randn({S, B, H}, DType::F64, 2);
    const Tensor W = randn({S, B, H}, DType::F64, 3);
    auto st = layer.make_stash();
    auto loss = [&] {
      layer.router().reset_counters();
      return kernels::dot(layer.forward(x, *st), W) + moe::MoELayer::aux_loss_total(*st);
    };
    reg.zero_grad();
    loss();
    const Tensor dx = layer.backward(W, *st);
    const std::string name(kernels::activation_name(act));
    EXPECT_LT(fd_rel_error(loss, x, dx, 200), kGradTol) << name << ": input";
    for (auto& p : reg.all()) EXPECT_LT(fd_rel_error(loss, p->value, p->grad, 80), kGradTol) << name << ": " << p->name;
  }
}

// With f32 parameters the router may compute in f64 (--moe-router-dtype fp64): the gating bias enters the f64 logits
// and its gradient, summed in f64, is added to the f32 gradient; the same as routing in f32 to f32 rounding.
TEST(MoELayerBias, RouterBiasUnderAnF64RouterDtype) {
  std::vector<Tensor> grads[2];
  Tensor y[2];
  for (int i = 0; i < 2; i++) {
    moe::MoELayerConfig c = biased_layer(16, 4, 2);
    c.router.router_dtype = i == 0 ? DType::F32 : DType::F64;
    c.router.init_std = 0.02;
    nn::ParamRegistry reg(DType::F32);
    moe::MoELayer layer(reg, "mlp", c);
    reg.initialize(13);
    randomize(*layer.router().gating_bias(), 43, 0.05);
    reg.zero_grad();
    auto st = layer.make_stash();
    y[i] = layer.forward(randn({4, 2, 16}, DType::F32, 5), *st);
    layer.backward(randn({4, 2, 16}, DType::F32, 6), *st);
    grads[i] = {layer.router().gating_bias()->grad.clone(), layer.router().weight().grad.clone()};
  }
  EXPECT_LT(testing::max_rel_diff(y[1], y[0]), 1e-5);
  EXPECT_GT(kernels::sum_squares(grads[1][0]), 0.0);
  EXPECT_LT(testing::max_rel_diff(grads[1][0], grads[0][0]), 1e-4);
  EXPECT_LT(testing::max_rel_diff(grads[1][1], grads[0][1]), 1e-4);
}

// Megatron's test_sequential_mlp model (H 12, 2 experts, SwiGLU, FFN 48: 3480 parameters without biases) gains the
// router's [2], fc1's [2, 96] and fc2's [2, 12] biases: 3698. Megatron's names; zero expert biases, a router bias
// drawn like its weight; no weight decay; expert parallel; Adam's, not Muon's.
TEST(MoELayerBias, ParametersNamesCountsAndOptimizerRules) {
  nn::ParamRegistry reg;
  moe::MoELayerConfig c = testing::sequential_mlp_moe();
  c.bias = true;
  moe::MoELayer layer(reg, "mlp", c);
  reg.initialize(1);
  EXPECT_EQ(reg.numel(), 3698);
  nn::Parameter& rb = reg.get("mlp.router.bias");
  nn::Parameter& b1 = reg.get("mlp.experts.linear_fc1.bias");
  nn::Parameter& b2 = reg.get("mlp.experts.linear_fc2.bias");
  EXPECT_EQ(rb.value.shape(), Shape({2}));
  EXPECT_EQ(b1.value.shape(), Shape({2, 96}));
  EXPECT_EQ(b2.value.shape(), Shape({2, 12}));
  EXPECT_GT(kernels::sum_squares(rb.value), 0.0);
  EXPECT_EQ(kernels::sum_squares(b1.value) + kernels::sum_squares(b2.value), 0.0);
  for (nn::Parameter* p : {&rb, &b1, &b2}) {
    EXPECT_TRUE(p->no_weight_decay) << p->name;
    EXPECT_FALSE(optim::is_muon_matrix(*p)) << p->name;
  }
  EXPECT_TRUE(b1.expert_parallel && b2.expert_parallel && !rb.expert_parallel);
  EXPECT_TRUE(optim::is_muon_matrix(layer.experts().fc1()) && optim::is_muon_matrix(layer.router().weight()));
}

}  // namespace
}  // namespace moecore
