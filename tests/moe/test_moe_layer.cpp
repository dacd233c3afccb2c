// The MoE layer: fp64 finite-difference gradients of the whole layer (router, aux and z losses included),
// grouped experts against the sequential reference, dispatcher round trip and adjointness, zero-token experts,
// --moe-layer-freq parsing, bitwise repeatability, and an MoE GPT learning the copy task.
#include <gtest/gtest.h>

#include "copy_task.h"
#include "model_util.h"
#include "moecore/core/allocator.h"
#include "moecore/kernels/elementwise.h"
#include "moecore/kernels/gemm.h"
#include "moecore/moe/moe_layer.h"
#include "moecore/nn/gpt_model.h"
#include "test_util.h"

namespace moecore {
namespace {

using testing::fd_rel_error;
using testing::kGradTol;
using testing::randn;

struct MoeLayerCase {
  std::string name;
  moe::MoELayerConfig cfg;
  bool set_bias = false;
};

std::vector<MoeLayerCase> gradient_cases() {
  std::vector<MoeLayerCase> cases;
  {
    MoeLayerCase c{"softmax post, aux + seq aux + z", testing::fd_moe_layer(8, 4, 2)};
    c.cfg.router.load_balancing = {moe::LoadBalancingType::AuxLoss, moe::LoadBalancingType::SeqAuxLoss};
    c.cfg.router.aux_loss_coeff = {0.3, 0.2};
    c.cfg.router.z_loss_coeff = 0.05;
    cases.push_back(c);
  }
  {
    MoeLayerCase c{"softmax pre, scaling, global aux, shared expert with gate", testing::fd_moe_layer(8, 4, 2)};
    c.cfg.router.pre_softmax = true;
    c.cfg.router.topk_scaling_factor = 2.5;
    c.cfg.router.load_balancing = {moe::LoadBalancingType::GlobalAuxLoss};
    c.cfg.router.aux_loss_coeff = {0.5};
    c.cfg.shared_ffn_hidden = 5;
    c.cfg.shared_expert_gate = true;
    cases.push_back(c);
  }
  {
    MoeLayerCase c{"sigmoid, groups, expert bias, aux + z", testing::fd_moe_layer(8, 8, 4)};
    c.cfg.router.score_function = moe::ScoreFunction::Sigmoid;
    c.cfg.router.num_groups = 4;
    c.cfg.router.group_topk = 2;
    c.cfg.router.enable_expert_bias = true;
    c.cfg.router.load_balancing = {moe::LoadBalancingType::AuxLoss};
    c.cfg.router.aux_loss_coeff = {0.4};
    c.cfg.router.z_loss_coeff = 0.02;
    c.set_bias = true;
    cases.push_back(c);
  }
  {
    MoeLayerCase c{"sigmoid k=1, gelu, capacity 1.0 by probs", testing::fd_moe_layer(8, 4, 1)};
    c.cfg.router.score_function = moe::ScoreFunction::Sigmoid;
    c.cfg.activation = kernels::Activation::GeLU;
    c.cfg.router.capacity_factor = 1.0;
    c.cfg.router.load_balancing = {moe::LoadBalancingType::AuxLoss};
    c.cfg.router.aux_loss_coeff = {0.1};
    cases.push_back(c);
  }
  {
    MoeLayerCase c{"softmax post, squared-relu, padded capacity by position", testing::fd_moe_layer(8, 4, 2)};
    c.cfg.activation = kernels::Activation::SquaredReLU;
    c.cfg.router.capacity_factor = 0.75;
    c.cfg.router.pad_to_capacity = true;
    c.cfg.router.drop_policy = moe::DropPolicy::Position;
    cases.push_back(c);
  }
  return cases;
}

TEST(MoELayerGrad, WholeLayerFiniteDifferences) {
  for (const MoeLayerCase& c : gradient_cases()) {
    nn::ParamRegistry reg(DType::F64);
    moe::MoELayer layer(reg, "mlp", c.cfg);
    reg.initialize(11);
    if (c.set_bias)
      for (int64_t e = 0; e < c.cfg.router.num_experts; e++)
        layer.router().expert_bias().set_item(e, 0.05 * static_cast<double>(e % 3));
    const int64_t S = 3, B = 2, H = c.cfg.router.hidden;
    Tensor x = randn({S, B, H}, DType::F64, 2);
    Tensor W = randn({S, B, H}, DType::F64, 3);
    auto st = layer.make_stash();
    const double loss_scale = 0.7;
    auto loss = [&] {
      layer.router().reset_counters();
      Tensor y = layer.forward(x, *st);
      return kernels::dot(y, W) + loss_scale * moe::MoELayer::aux_loss_total(*st);
    };
    reg.zero_grad();
    loss();
    EXPECT_TRUE(c.cfg.router.aux_loss_coeff[0] == 0 || moe::MoELayer::aux_loss_total(*st) > 0) << c.name;
    st->loss_scale = loss_scale;
    Tensor dx = layer.backward(W, *st);
    EXPECT_LT(fd_rel_error(loss, x, dx, 200), kGradTol) << c.name << ": input";
    for (auto& p : reg.all())
      EXPECT_LT(fd_rel_error(loss, p->value, p->grad, 80), kGradTol) << c.name << ": " << p->name;
  }
}

TEST(GroupedExperts, EqualsSequentialReference) {
  for (auto act : {kernels::Activation::SwiGLU, kernels::Activation::GeLU, kernels::Activation::SquaredReLU}) {
    const int64_t H = 12, F = 10, E = 5;
    const std::vector<int64_t> counts{3, 0, 7, 1, 0};  // experts 1 and 4 get no rows
    const int64_t R = 11;
    for (DType dt : {DType::F64, DType::F32}) {
      nn::ParamRegistry reg(dt);
      moe::GroupedExperts ex(reg, "experts", moe::ExpertsConfig{H, F, E, 0, act, 0.3, 0.3, std::nullopt});
      reg.initialize(3);
      Tensor x = randn({R, H}, dt, 1), p = randn({R}, dt, 2);
      moe::GroupedExperts::Stash st;
      Tensor y = ex.forward(x, p, counts, st);
      Tensor ref = moe::sequential_experts_forward(ex.fc1().value, ex.fc2().value, act, x, p, counts);
      EXPECT_LT(testing::max_rel_diff(y, ref), dt == DType::F64 ? 1e-13 : 2e-6) << kernels::activation_name(act);
      // Experts without rows receive no gradient.
      reg.zero_grad();
      Tensor dp;
      ex.backward(randn({R, H}, dt, 4), st, dp);
      EXPECT_EQ(kernels::sum_squares(ex.fc1().grad.slice(1, 1)), 0.0);
      EXPECT_EQ(kernels::sum_squares(ex.fc2().grad.slice(4, 1)), 0.0);
      EXPECT_GT(kernels::sum_squares(ex.fc1().grad.slice(2, 1)), 0.0);
    }
  }
}

// Mixtral's expert width makes the fc1 data-gradient reduction long (K = 2F = 28,672 >= 16,384, run in chunks):
// building and running such experts must work (it asserted in the GEMM primitive preparation before).
TEST(GroupedExperts, LongReductionWidthBuildsAndRuns) {
  const int64_t H = 8, F = 14336, E = 2, R = 40;
  const std::vector<int64_t> counts{25, 15};
  nn::ParamRegistry reg(DType::F32);
  moe::GroupedExperts ex(reg, "experts",
                         moe::ExpertsConfig{H, F, E, 0, kernels::Activation::SwiGLU, 0.02, 0.02, std::nullopt});
  reg.initialize(5);
  const Tensor x = randn({R, H}, DType::F32, 1), p = randn({R}, DType::F32, 2);
  moe::GroupedExperts::Stash st;
  const Tensor y = ex.forward(x, p, counts, st);
  const Tensor ref =
      moe::sequential_experts_forward(ex.fc1().value, ex.fc2().value, kernels::Activation::SwiGLU, x, p, counts);
  EXPECT_LT(testing::max_rel_diff(y, ref), 1e-5);
  Tensor dp;
  const Tensor dx = ex.backward(randn({R, H}, DType::F32, 3), st, dp);
  EXPECT_TRUE(std::isfinite(kernels::sum_squares(dx)));
}

TEST(GroupedExperts, ParameterCountMatchesMegatron) {
  // Megatron test_sequential_mlp: H=12, E=2, SwiGLU, ffn=48 → 3480 parameters (router 24 + 2·(12·96 + 48·12)).
  nn::ParamRegistry reg;
  moe::MoELayerConfig c = testing::sequential_mlp_moe();
  moe::MoELayer layer(reg, "mlp", c);
  EXPECT_EQ(reg.numel(), 3480);
}

TEST(Dispatcher, RoundTripAndAdjoint) {
  const int64_t T = 7, E = 4, H = 5, K = 2;
  moe::RoutedTokens routed{Tensor::empty({T, K}, DType::I32), Tensor::empty({T, K}, DType::F64), 0};
  for (int64_t t = 0; t < T; t++)
    for (int64_t j = 0; j < K; j++) {
      const int64_t e = (t * 3 + j * (1 + t % 2)) % E;
      routed.idx_TK.set_item(t * K + j, static_cast<double>(e));
      routed.probs_TK.set_item(t * K + j, 1.0 / K);
    }
  auto routes_to = [&](int64_t t, int64_t e) {
    for (int64_t j = 0; j < K; j++)
      if (routed.idx_TK.item(t * K + j) == static_cast<double>(e)) return true;
    return false;
  };
  moe::LocalTokenDispatcher d(E);
  moe::DispatchPlan plan;
  Tensor x = randn({T, H}, DType::F64, 1), x_RH, p_R;
  d.dispatch(x, routed, plan, x_RH, p_R);
  EXPECT_EQ(plan.R, T * K);
  // Expert-major, ascending token inside an expert.
  const int32_t* tok = plan.row_token_R.data<int32_t>();
  int64_t r = 0;
  for (int64_t e = 0; e < E; e++)
    for (int64_t i = 0; i < plan.tokens_per_expert[e]; i++, r++) {
      EXPECT_TRUE(routes_to(tok[r], e));
      if (i > 0) {
        EXPECT_LT(tok[r - 1], tok[r]);
      }
    }
  // Identity experts scaled by prob 1/k: combine returns the input exactly.
  Tensor scaled = x_RH.clone();
  for (int64_t i = 0; i < plan.R; i++)
    for (int64_t h = 0; h < H; h++) scaled.set_item(i * H + h, x_RH.item(i * H + h) * p_R.item(i));
  EXPECT_LT(testing::max_rel_diff(d.combine(scaled, plan), x), 1e-15);
  // <combine(y), z> = <y, combineᵀ(z)> and <dispatch(x), w> = <x, dispatchᵀ(w)>.
  Tensor y = randn({plan.R, H}, DType::F64, 2), z = randn({T, H}, DType::F64, 3);
  EXPECT_NEAR(kernels::dot(d.combine(y, plan), z), kernels::dot(y, d.combine_backward(z, plan)), 1e-12);
  Tensor w = randn({plan.R, H}, DType::F64, 4), wp = randn({plan.R}, DType::F64, 5), dx, dprobs;
  d.dispatch_backward(w, wp, plan, DType::F64, dx, dprobs);
  EXPECT_NEAR(kernels::dot(x_RH, w), kernels::dot(x, dx), 1e-12);
  EXPECT_NEAR(kernels::dot(p_R, wp), kernels::dot(routed.probs_TK, dprobs), 1e-12);
}

TEST(MoELayer, ZeroTokenExpertsAndAllDroppedTokens) {
  moe::MoELayerConfig c = testing::fd_moe_layer(8, 4, 1);
  c.router.score_function = moe::ScoreFunction::Sigmoid;
  c.router.capacity_factor = 0.5;  // C = ceil(1·6/4·0.5) = 1: most tokens lose their only expert
  nn::ParamRegistry reg(DType::F64);
  moe::MoELayer layer(reg, "mlp", c);
  reg.initialize(5);
  Tensor x = randn({3, 2, 8}, DType::F64, 1);
  auto st = layer.make_stash();
  Tensor y = layer.forward(x, *st);
  int64_t kept = 0;
  for (int64_t n : layer.stats().tokens_per_expert) {
    EXPECT_LE(n, 1);
    kept += n;
  }
  EXPECT_EQ(kept + layer.stats().dropped, 6);
  // A token whose every assignment was dropped gets a zero MoE output (the residual carries it).
  int64_t zero_rows = 0;
  for (int64_t t = 0; t < 6; t++) {
    double s = 0;
    for (int64_t h = 0; h < 8; h++) s += std::fabs(y.item(t * 8 + h));
    zero_rows += s == 0;
  }
  EXPECT_EQ(zero_rows, 6 - kept);
  Tensor dx = layer.backward(randn({3, 2, 8}, DType::F64, 2), *st);
  EXPECT_EQ(dx.shape(), x.shape());
}

TEST(MoELayer, TwoRunsAreBitwiseEqual) {
  Tensor grads[2], outs[2];
  for (int run = 0; run < 2; run++) {
    moe::MoELayerConfig c = testing::fd_moe_layer(32, 8, 2);
    c.router.router_dtype = DType::F32;
    c.router.load_balancing = {moe::LoadBalancingType::AuxLoss};
    c.router.aux_loss_coeff = {0.01};
    c.ffn_hidden = 48;
    nn::ParamRegistry reg(DType::F32);
    moe::MoELayer layer(reg, "mlp", c);
    reg.initialize(9);
    Tensor x = randn({64, 4, 32}, DType::F32, 1);
    auto st = layer.make_stash();
    outs[run] = layer.forward(x, *st);
    layer.backward(randn({64, 4, 32}, DType::F32, 2), *st);
    grads[run] = layer.experts().fc1().grad.clone();
  }
  EXPECT_TRUE(testing::bitwise_equal(outs[0], outs[1]));
  EXPECT_TRUE(testing::bitwise_equal(grads[0], grads[1]));
}

TEST(MoELayerFreq, IntegersAndLists) {
  EXPECT_EQ(moe::parse_moe_layer_freq("1", 3), (std::vector<bool>{true, true, true}));
  EXPECT_EQ(moe::parse_moe_layer_freq("2", 4), (std::vector<bool>{true, false, true, false}));
  EXPECT_EQ(moe::parse_moe_layer_freq("([0]*1+[1]*3)", 4), (std::vector<bool>{false, true, true, true}));
  EXPECT_EQ(moe::parse_moe_layer_freq("[0, 1, 1, 1]", 4), (std::vector<bool>{false, true, true, true}));
  EXPECT_EQ(moe::parse_moe_layer_freq("[0]*2+[1,0]*1", 4), (std::vector<bool>{false, false, true, false}));
  EXPECT_THROW(moe::parse_moe_layer_freq("([0]*1+[1]*3)", 5), Error);
  EXPECT_THROW(moe::parse_moe_layer_freq("[2]*4", 4), Error);
  EXPECT_THROW(moe::parse_moe_layer_freq("0", 4), Error);
  EXPECT_THROW(moe::parse_moe_layer_freq("[0,1", 2), Error);
}

nn::FfnFactory moe_factory(const moe::MoELayerConfig& base, std::vector<bool> is_moe) {
  return
      [base, is_moe](nn::ParamRegistry& reg, const std::string& name, int64_t i) -> std::unique_ptr<nn::FeedForward> {
        if (!is_moe[static_cast<size_t>(i)]) return nullptr;
        return std::make_unique<moe::MoELayer>(reg, name, base);
      };
}

TEST(MoEGPT, GradientOfAMixedDenseAndMoEModel) {
  const nn::GPTConfig g = testing::small_gpt({});
  moe::MoELayerConfig m = testing::fd_moe_layer(8, 4, 2);
  m.router.load_balancing = {moe::LoadBalancingType::AuxLoss};
  m.router.aux_loss_coeff = {0.2};
  m.shared_ffn_hidden = 4;
  nn::ParamRegistry reg(DType::F64);
  nn::GPTModel model(g, reg, moe_factory(m, moe::parse_moe_layer_freq("([0]*1+[1]*1)", 2)));
  reg.initialize(3);
  auto& moe_layer = static_cast<moe::MoELayer&>(model.layer(1).ffn());
  Tensor tokens = testing::randint({2, 4}, 13, 1), labels = testing::randint({2, 4}, 13, 2);
  auto st = model.make_stash();
  const double scale = 0.5;
  auto loss = [&] {
    moe_layer.router().reset_counters();
    const double lm = model.forward(tokens, labels, Tensor(), st);
    return scale * (lm + moe::MoELayer::aux_loss_total(*st.layers[1].ffn));
  };
  reg.zero_grad();
  loss();
  model.backward(st, scale);
  for (auto& p : reg.all()) EXPECT_LT(fd_rel_error(loss, p->value, p->grad, 30), kGradTol) << p->name;
}

moe::MoELayerConfig moe_copy_layer() {
  moe::MoELayerConfig m;
  m.router.hidden = 64;
  m.router.num_experts = 8;
  m.router.topk = 2;
  m.router.score_function = moe::ScoreFunction::Sigmoid;
  m.router.enable_expert_bias = true;
  m.router.load_balancing = {moe::LoadBalancingType::AuxLoss};
  m.router.aux_loss_coeff = {1e-2};
  m.ffn_hidden = 32;
  m.shared_ffn_hidden = 32;
  return m;
}

void finish_global_batch(nn::GPTModel& model) {
  model.finish_global_batch();
}

TEST(MoEGPT, LearnsCopyTaskWithBalancedExperts) {
  testing::Trainer t(testing::copy_config(), moe_factory(moe_copy_layer(), {true, true}));
  t.after_backward = [&] { finish_global_batch(t.model); };
  t.decay_steps = 600;
  double last = 0;
  for (int s = 0; s < 600; s++) {
    last = t.train_step(testing::copy_batch(16, 8, 16, s));
    if (s >= 50 && last < 0.01) break;
  }
  EXPECT_LT(last, 0.05);
  auto& layer = static_cast<moe::MoELayer&>(t.model.layer(1).ffn());
  const nn::RoutingStats& stats = *layer.routing_stats();  // the last global batch
  EXPECT_GT(stats.micro_batches, 0);
  EXPECT_LT(stats.max_load() / stats.mean_load(), 2.0) << "aux loss and expert bias keep load even";
  double bias_norm = 0;
  for (int64_t e = 0; e < 8; e++) bias_norm += std::fabs(layer.router().expert_bias().item(e));
  EXPECT_GT(bias_norm, 0.0) << "the expert bias was updated once per step";
}

TEST(MoEGPT, SteadyStateStepAllocatesNothingAndCreatesNoPrimitive) {
  testing::Trainer t(testing::copy_config(), moe_factory(moe_copy_layer(), {true, true}));
  t.after_backward = [&] { finish_global_batch(t.model); };
  testing::CopyBatch b = testing::copy_batch(8, 8, 16, 0);
  for (int i = 0; i < 3; i++) t.train_step(b);
  const AllocatorMark mark = Allocator::instance().mark();
  const int64_t prims = kernels::gemm_stats().primitives_created;
  for (int i = 0; i < 3; i++) t.train_step(b);
  EXPECT_EQ(Allocator::instance().system_allocs_since(mark), 0);
  EXPECT_EQ(kernels::gemm_stats().primitives_created, prims);
}

}  // namespace
}  // namespace moecore
