// Muon, Newton–Schulz and SGD against numbers computed independently (tests/optim/muon_reference.py: plain
// float64 Python) and by hand.
#include <gtest/gtest.h>

#include <cmath>

#include "moecore/optim/adamw.h"
#include "moecore/optim/muon.h"
#include "moecore/optim/newton_schulz.h"
#include "moecore/optim/sgd.h"
#include "test_util.h"

using namespace moecore;
using namespace moecore::testing;

namespace {
Tensor matrix(const Shape& s, std::vector<float> v) {
  Tensor t = Tensor::empty(s, DType::F32);
  EXPECT_EQ(static_cast<int64_t>(v.size()), t.numel());
  std::copy(v.begin(), v.end(), t.data<float>());
  return t;
}

void expect_near_all(const Tensor& t, const std::vector<double>& want, double tol) {
  ASSERT_EQ(t.numel(), static_cast<int64_t>(want.size()));
  for (int64_t i = 0; i < t.numel(); i++) EXPECT_NEAR(t.data<float>()[i], want[static_cast<size_t>(i)], tol) << i;
}

const std::vector<float> kG32 = {0.5f, -1.0f, 2.0f, 0.25f, -0.75f, 1.5f};
const std::vector<float> kG2 = {-0.2f, 0.3f, 0.1f, 0.9f, 0.4f, -0.5f};
const std::vector<float> kP = {0.1f, 0.2f, -0.3f, 0.4f, 0.5f, -0.6f};

optim::MuonConfig fp32_config() {
  optim::MuonConfig c;
  c.bf16_matmul = false;
  return c;
}
}  // namespace

TEST(NewtonSchulz, QuinticMatchesTheReference) {
  // From muon_reference.py (float64); fp32 GEMMs agree to ~1e-6.
  expect_near_all(optim::newton_schulz(matrix({3, 2}, kG32), 5, "quintic", false),
                  {0.154056698, -0.528423337, 0.946691704, 0.297338291, -0.231085047, 0.792635006}, 2e-5);
  const Tensor g44 = matrix(
      {4, 4}, {1.0f, 0.2f, -0.3f, 0.4f, 0.1f, -0.8f, 0.5f, 0.05f, 0.6f, 0.3f, 0.9f, -0.2f, -0.4f, 0.7f, 0.1f, 1.1f});
  expect_near_all(
      optim::newton_schulz(g44, 5, "quintic", false),
      {0.877457252, 0.0350644226, -0.353467469, 0.373213727, 0.0706769855, -0.839275094, 0.451067223, 0.335298347,
       0.400734317, 0.387586154, 0.820972378, -0.219324059, -0.304819846, 0.394730853, 0.204856156, 0.840202675},
      2e-5);
}

TEST(NewtonSchulz, Bf16ProductsStayCloseAndEndInBf16) {
  const Tensor g = matrix({3, 2}, kG32);
  const Tensor a = optim::newton_schulz(g, 5, "quintic", false), b = optim::newton_schulz(g, 5, "quintic", true);
  for (int64_t i = 0; i < a.numel(); i++) {
    const float v = b.data<float>()[i];
    EXPECT_NEAR(v, a.data<float>()[i], 3e-2);
    EXPECT_EQ(v, bf16_to_float(float_to_bf16(v)));  // rounded to bf16 after the last step, as torch leaves it
  }
  EXPECT_GT(max_rel_diff(a, b), 0.0);  // the bf16 path is a different computation
}

TEST(NewtonSchulz, ZeroStaysZeroAndStepCountsAreChecked) {
  const Tensor z = optim::newton_schulz(Tensor::zeros({2, 3}, DType::F32), 5, "quintic", false);
  for (int64_t i = 0; i < z.numel(); i++) EXPECT_EQ(z.data<float>()[i], 0.0f);
  EXPECT_NO_THROW(optim::check_newton_schulz("quintic", 10));
  EXPECT_NO_THROW(optim::check_newton_schulz("simple", 3));
  EXPECT_NO_THROW(optim::check_newton_schulz("polar_express", 9));
  EXPECT_NE(user_error_of([] { optim::check_newton_schulz("quintic", 4); }).find("multiple of 5"), std::string::npos);
  EXPECT_NE(user_error_of([] { optim::check_newton_schulz("aol", 5); }).find("multiple of 4"), std::string::npos);
  EXPECT_NE(user_error_of([] { optim::check_newton_schulz("polar_express", 7); }).find("at least 8"),
            std::string::npos);
  EXPECT_NE(user_error_of([] { optim::check_newton_schulz("cans", 5); }).find("cans"), std::string::npos);
}

TEST(NewtonSchulz, SimpleCoefficientsOrthogonalise) {
  // Many simple steps leave singular values near 1: X·Xᵀ ≈ I within the iteration's known ±0.3 band.
  const Tensor x = optim::newton_schulz(matrix({2, 3}, {0.5f, -1.0f, 2.0f, 0.25f, -0.75f, 1.5f}), 10, "simple", false);
  const float* p = x.data<float>();
  for (int i = 0; i < 2; i++) {
    double d = 0;
    for (int k = 0; k < 3; k++) d += static_cast<double>(p[i * 3 + k]) * p[i * 3 + k];
    EXPECT_NEAR(d, 1.0, 0.35);
  }
}

TEST(MuonScale, Modes) {
  EXPECT_DOUBLE_EQ(optim::muon_scale_factor(3, 2, "spectral"), std::sqrt(3.0));
  EXPECT_DOUBLE_EQ(optim::muon_scale_factor(2, 3, "spectral"), std::sqrt(3.0));
  EXPECT_DOUBLE_EQ(optim::muon_scale_factor(3, 2, "unit_rms_norm"), std::sqrt(1.5));
  EXPECT_DOUBLE_EQ(optim::muon_scale_factor(2, 3, "unit_rms_norm"), std::sqrt(2.0 / 3.0));
  EXPECT_DOUBLE_EQ(optim::muon_scale_factor(3, 2, "shape_scaling"), std::sqrt(1.5));
  EXPECT_DOUBLE_EQ(optim::muon_scale_factor(2, 3, "shape_scaling"), 1.0);
}

namespace {
// Two Muon steps (lr 0.1, wd 0.01, β 0.9, spectral × extra 0.5) on one 3x2 weight, as muon_reference.py does.
Tensor two_muon_steps(bool nesterov) {
  nn::ParamRegistry reg;
  nn::Parameter& p = reg.add("decoder.layers.0.mlp.linear_fc2.weight", {3, 2}, nn::InitRule::zeros());
  p.value = matrix({3, 2}, kP);
  optim::MuonConfig c = fp32_config();
  c.nesterov = nesterov;
  c.extra_scale_factor = 0.5;
  optim::Muon muon(
      {&p}, 1, [](const nn::Parameter&) { return size_t{0}; }, nullptr, nullptr, {1.0}, c, false);
  kernels::AdamWParams hp;
  hp.lr = 0.1;
  hp.weight_decay = 0.01;
  p.grad = matrix({3, 2}, kG32);
  muon.step(hp, 1);
  p.grad = matrix({3, 2}, kG2);
  muon.step(hp, 2);
  return p.value;
}
}  // namespace

TEST(Muon, TwoStepsMatchTheReference) {
  expect_near_all(two_muon_steps(false),
                  {0.0611140174, 0.29156927, -0.457236833, 0.335414211, 0.550789676, -0.731273561}, 2e-5);
  expect_near_all(two_muon_steps(true),
                  {0.0320454062, 0.303066122, -0.445067886, 0.317112724, 0.534495803, -0.694942279}, 2e-5);
}

TEST(Muon, TakesMatricesButNotEmbeddingsOrVectors) {
  nn::ParamRegistry reg;
  EXPECT_TRUE(optim::is_muon_matrix(reg.add("decoder.layers.0.mlp.router.weight", {4, 8}, nn::InitRule::zeros())));
  EXPECT_FALSE(optim::is_muon_matrix(reg.add("embedding.word_embeddings.weight", {16, 8}, nn::InitRule::zeros())));
  EXPECT_FALSE(optim::is_muon_matrix(reg.add("output_layer.weight", {16, 8}, nn::InitRule::zeros())));
  EXPECT_FALSE(optim::is_muon_matrix(reg.add("decoder.final_layernorm.weight", {8}, nn::InitRule::ones())));
  nn::Parameter& e = reg.add("decoder.layers.0.mlp.experts.linear_fc1.weight", {2, 3, 2}, nn::InitRule::zeros());
  EXPECT_FALSE(optim::is_muon_matrix(e));  // a 3-D dense tensor is not a matrix...
  e.expert_parallel = true;
  EXPECT_TRUE(optim::is_muon_matrix(e));  // ...a grouped expert weight is one per expert
}

TEST(Muon, GroupedExpertsAreOrthogonalisedOneByOne) {
  nn::ParamRegistry reg;
  nn::Parameter& e = reg.add("decoder.layers.0.mlp.experts.linear_fc1.weight", {2, 3, 2}, nn::InitRule::zeros());
  e.expert_parallel = true;
  std::vector<float> g = kG32;
  g.insert(g.end(), kG2.begin(), kG2.end());
  e.grad = matrix({2, 3, 2}, g);
  optim::MuonConfig c = fp32_config();
  c.momentum = 0.0;  // the update is the gradient itself
  optim::Muon muon(
      {&e}, 1, [](const nn::Parameter&) { return size_t{0}; }, nullptr, nullptr, {1.0}, c, false);
  kernels::AdamWParams hp;
  hp.lr = 1.0;
  hp.weight_decay = 0;
  muon.step(hp, 1);  // value was 0: it is now −√3 · NS(each expert's gradient)
  for (int x = 0; x < 2; x++) {
    const Tensor want = optim::newton_schulz(matrix({3, 2}, x == 0 ? kG32 : kG2), 5, "quintic", false);
    for (int i = 0; i < 6; i++)
      EXPECT_NEAR(e.value.data<float>()[x * 6 + i], -std::sqrt(3.0) * want.data<float>()[i], 1e-6);
  }
}

TEST(Muon, NoSplitQkvStacksTheLayersProjections) {
  nn::ParamRegistry reg;
  nn::Parameter& q = reg.add("decoder.layers.0.self_attention.linear_q.weight", {2, 4}, nn::InitRule::zeros());
  nn::Parameter& k = reg.add("decoder.layers.0.self_attention.linear_k.weight", {1, 4}, nn::InitRule::zeros());
  nn::Parameter& v = reg.add("decoder.layers.0.self_attention.linear_v.weight", {1, 4}, nn::InitRule::zeros());
  const std::vector<float> g = {1.0f, 0.2f, -0.3f, 0.4f,  0.1f,  -0.8f, 0.5f, 0.05f,
                                0.6f, 0.3f, 0.9f,  -0.2f, -0.4f, 0.7f,  0.1f, 1.1f};
  q.grad = matrix({2, 4}, {g.begin(), g.begin() + 8});
  k.grad = matrix({1, 4}, {g.begin() + 8, g.begin() + 12});
  v.grad = matrix({1, 4}, {g.begin() + 12, g.end()});
  for (bool split : {false, true}) {
    for (auto* p : {&q, &k, &v}) p->value = Tensor::zeros(p->value.shape(), DType::F32);
    optim::MuonConfig c = fp32_config();
    c.momentum = 0.0;
    c.split_qkv = split;
    optim::Muon muon(
        {&q, &k, &v}, 1, [](const nn::Parameter&) { return size_t{0}; }, nullptr, nullptr, {1.0, 1.0, 1.0}, c, false);
    kernels::AdamWParams hp;
    hp.lr = 1.0;
    hp.weight_decay = 0;
    muon.step(hp, 1);
    if (!split) {  // one 4x4 matrix, scale √4
      const Tensor want = optim::newton_schulz(matrix({4, 4}, g), 5, "quintic", false);
      for (int i = 0; i < 8; i++) EXPECT_NEAR(q.value.data<float>()[i], -2.0 * want.data<float>()[i], 1e-6);
      for (int i = 0; i < 4; i++) EXPECT_NEAR(v.value.data<float>()[i], -2.0 * want.data<float>()[12 + i], 1e-6);
    } else {  // k alone: a 1x4 row normalises to a unit-ish row, scale √4
      const Tensor want = optim::newton_schulz(k.grad, 5, "quintic", false);
      for (int i = 0; i < 4; i++) EXPECT_NEAR(k.value.data<float>()[i], -2.0 * want.data<float>()[i], 1e-6);
    }
  }
}

TEST(Muon, MomentsRoundTrip) {
  nn::ParamRegistry reg;
  nn::Parameter& p = reg.add("decoder.layers.0.mlp.linear_fc2.weight", {3, 2}, nn::InitRule::zeros());
  p.grad = matrix({3, 2}, kG32);
  optim::Muon muon(
      {&p}, 1, [](const nn::Parameter&) { return size_t{0}; }, nullptr, nullptr, {1.0}, fp32_config(), false);
  kernels::AdamWParams hp;
  muon.step(hp, 1);
  std::vector<Tensor> m, v;
  muon.gather_moments(m, v);
  ASSERT_EQ(m.size(), 1u);
  for (int i = 0; i < 6; i++) EXPECT_FLOAT_EQ(m[0].data<float>()[i], 0.1f * kG32[static_cast<size_t>(i)]);
  for (int i = 0; i < 6; i++) EXPECT_EQ(v[0].data<float>()[i], 0.0f);
  m[0].data<float>()[0] = 7.0f;
  muon.load_moments(m, v);
  std::vector<Tensor> m2, v2;
  muon.gather_moments(m2, v2);
  EXPECT_EQ(m2[0].data<float>()[0], 7.0f);
}

TEST(Sgd, TwoMomentumStepsByHand) {
  // lr 0.1, wd 0.1, momentum 0.9, g = [0.5, −1] twice, p = [1, 2]:
  // d1 = g + wd·p = [0.6, −0.8], buf = d1, p = [0.94, 2.08];
  // d2 = [0.594, −0.792], buf = 0.9·[0.6, −0.8] + d2 = [1.134, −1.512], p = [0.8266, 2.2312].
  nn::ParamRegistry reg;
  nn::Parameter& p = reg.add("w", {2}, nn::InitRule::zeros());
  p.value = matrix({2}, {1.0f, 2.0f});
  p.grad = matrix({2}, {0.5f, -1.0f});
  optim::AdamW sgd({&p}, optim::ElementRule{true, 0.9});
  kernels::AdamWParams hp;
  hp.lr = 0.1;
  hp.weight_decay = 0.1;
  sgd.step(hp, 1);
  EXPECT_NEAR(p.value.data<float>()[0], 0.94, 1e-6);
  EXPECT_NEAR(p.value.data<float>()[1], 2.08, 1e-6);
  sgd.step(hp, 2);
  EXPECT_NEAR(p.value.data<float>()[0], 0.8266, 1e-6);
  EXPECT_NEAR(p.value.data<float>()[1], 2.2312, 1e-6);
  EXPECT_NEAR(sgd.exp_avg()[0].data<float>()[0], 1.134, 1e-6);
  EXPECT_EQ(sgd.exp_avg_sq()[0].data<float>()[0], 0.0f);
}

TEST(Sgd, ClippingScalesTheGradientAndNoDecayParametersSkipIt) {
  nn::ParamRegistry reg;
  nn::Parameter& p = reg.add("b", {1}, nn::InitRule::zeros(), /*no_weight_decay=*/true);
  p.value = matrix({1}, {1.0f});
  p.grad = matrix({1}, {2.0f});
  optim::AdamW sgd({&p}, optim::ElementRule{true, 0.0});
  kernels::AdamWParams hp;
  hp.lr = 0.5;
  hp.weight_decay = 0.3;
  hp.grad_scale = 0.25;
  sgd.step(hp, 1);
  EXPECT_FLOAT_EQ(p.value.data<float>()[0], 1.0f - 0.5f * 0.5f);  // g·0.25 = 0.5, no decay
}
