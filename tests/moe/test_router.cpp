// Router: hand-computed outputs for every score function and option, Megatron's aux/seq/global aux-loss and
// z-loss values on small logits, "uniform routing gives exactly 1", capacity counts, the expert-bias rule.
#include <gtest/gtest.h>

#include <cmath>

#include "moecore/moe/router.h"
#include "moecore/moe/token_dispatcher.h"
#include "router_util.h"
#include "test_util.h"

namespace moecore {
namespace {

using moe::Router;
using moe::RouterConfig;

using testing::IdentityRouter;
using testing::rows;
using testing::sig;

// Token t's probability for expert e (0 if e is not among its kept choices), and whether it routes to e.
double prob(const Router::Output& o, int64_t t, int64_t e) {
  const int64_t K = o.idx_TK.dim(1);
  for (int64_t j = 0; j < K; j++)
    if (o.idx_TK.item(t * K + j) == static_cast<double>(e)) return o.probs_TK.item(t * K + j);
  return 0.0;
}
double routed(const Router::Output& o, int64_t t, int64_t e) {
  const int64_t K = o.idx_TK.dim(1);
  double n = 0;
  for (int64_t j = 0; j < K; j++) n += o.idx_TK.item(t * K + j) == static_cast<double>(e);
  return n;
}

TEST(Router, SoftmaxPostTopK) {
  RouterConfig c;
  c.num_experts = 4;
  c.topk = 2;
  IdentityRouter r(c);
  Router::Stash st;
  auto out = r.router.forward(rows({{1, 2, 3, 0.5}}), 1, 1, false, st);
  const double p2 = std::exp(1.0) / (std::exp(1.0) + 1.0);
  EXPECT_NEAR(prob(out, 0, 2), p2, 1e-15);
  EXPECT_NEAR(prob(out, 0, 1), 1 - p2, 1e-15);
  EXPECT_EQ(prob(out, 0, 0), 0.0);
  EXPECT_EQ(routed(out, 0, 2) + routed(out, 0, 1), 2.0);
  EXPECT_EQ(routed(out, 0, 0) + routed(out, 0, 3), 0.0);
}

TEST(Router, SoftmaxPreTopKNotRenormalizedAndScaled) {
  RouterConfig c;
  c.num_experts = 4;
  c.topk = 2;
  c.pre_softmax = true;
  c.topk_scaling_factor = 2.5;
  IdentityRouter r(c);
  Router::Stash st;
  auto out = r.router.forward(rows({{1, 2, 3, 0.5}}), 1, 1, false, st);
  const double z = std::exp(1.0) + std::exp(2.0) + std::exp(3.0) + std::exp(0.5);
  EXPECT_NEAR(prob(out, 0, 2), 2.5 * std::exp(3.0) / z, 1e-15);
  EXPECT_NEAR(prob(out, 0, 1), 2.5 * std::exp(2.0) / z, 1e-15);
}

TEST(Router, SigmoidRenormalizedOverSelected) {
  RouterConfig c;
  c.num_experts = 4;
  c.topk = 2;
  c.score_function = moe::ScoreFunction::Sigmoid;
  IdentityRouter r(c);
  Router::Stash st;
  auto out = r.router.forward(rows({{1, -2, 0.5, 3}}), 1, 1, false, st);
  const double s3 = sig(3), s0 = sig(1);
  EXPECT_NEAR(prob(out, 0, 3), s3 / (s3 + s0), 1e-15);
  EXPECT_NEAR(prob(out, 0, 0), s0 / (s3 + s0), 1e-15);
  // k = 1: no renormalization.
  c.topk = 1;
  IdentityRouter r1(c);
  auto out1 = r1.router.forward(rows({{1, -2, 0.5, 3}}), 1, 1, false, st);
  EXPECT_NEAR(prob(out1, 0, 3), s3, 1e-15);
}

TEST(Router, ExpertBiasSelectsButDoesNotWeigh) {
  RouterConfig c;
  c.num_experts = 4;
  c.topk = 2;
  c.score_function = moe::ScoreFunction::Sigmoid;
  c.enable_expert_bias = true;
  IdentityRouter r(c);
  r.router.expert_bias().set_item(1, 10.0);  // expert 1 is selected although its score is the lowest
  Router::Stash st;
  auto out = r.router.forward(rows({{1, -2, 0.5, 3}}), 1, 1, false, st);
  const double s3 = sig(3), s1 = sig(-2);
  EXPECT_EQ(routed(out, 0, 1), 1.0);
  EXPECT_EQ(routed(out, 0, 3), 1.0);
  EXPECT_NEAR(prob(out, 0, 1), s1 / (s3 + s1), 1e-15);
}

TEST(Router, GroupLimitedTopK) {
  RouterConfig c;
  c.num_experts = 4;
  c.topk = 2;
  c.num_groups = 2;
  c.group_topk = 1;  // one group; its score is the sum of its top-2
  c.score_function = moe::ScoreFunction::Sigmoid;
  IdentityRouter r(c);
  Router::Stash st;
  // Global top-2 would be experts 0 and 2; group {0,1} scores σ(5)+σ(-10) < σ(4)+σ(3.9) of group {2,3}.
  auto out = r.router.forward(rows({{5, -10, 4, 3.9}}), 1, 1, false, st);
  EXPECT_EQ(routed(out, 0, 0), 0.0);
  EXPECT_EQ(routed(out, 0, 2), 1.0);
  EXPECT_EQ(routed(out, 0, 3), 1.0);
}

TEST(Router, AuxLossesHandComputed) {
  RouterConfig c;
  c.num_experts = 2;
  c.topk = 1;
  c.pre_softmax = true;
  c.load_balancing = {moe::LoadBalancingType::AuxLoss, moe::LoadBalancingType::SeqAuxLoss};
  c.aux_loss_coeff = {0.1, 0.01};
  c.z_loss_coeff = 0.001;
  IdentityRouter r(c);
  Router::Stash st;
  // Two tokens (S=1, B=2), both with softmax scores [0.25, 0.75]: A = [0.5, 1.5], counts c = [0, 2].
  const double l3 = std::log(3.0);
  r.router.forward(rows({{0, l3}, {0, l3}}), 1, 2, true, st);
  const nn::RoutingStats& stats = r.router.stats();
  // aux: coeff·E/(k·T²)·Σ A_e c_e = 0.1·2/4·3 = 0.15; seq (per sequence of one token): coeff·E/(k·1)·0.75·1,
  // mean over the 2 sequences = 0.01·1.5; z = 0.001·mean(lse²) with lse = log 4.
  const double aux = 0.1 * 2.0 / 4.0 * 3.0, seq = 0.01 * 1.5, z = 0.001 * std::log(4.0) * std::log(4.0);
  EXPECT_NEAR(st.aux_loss_total, aux + seq + z, 1e-15);
  EXPECT_NEAR(stats.loss_sums[0], aux / 0.1, 1e-14);
  EXPECT_NEAR(stats.loss_sums[1], seq / 0.01, 1e-14);
  EXPECT_NEAR(stats.z_loss_sum, z / 0.001, 1e-14);
  EXPECT_EQ(stats.loss_names[1], "seq_load_balancing_loss");
}

TEST(Router, GlobalAuxLossAveragesCountsOverMicroBatches) {
  RouterConfig c;
  c.num_experts = 2;
  c.topk = 1;
  c.pre_softmax = true;
  c.load_balancing = {moe::LoadBalancingType::GlobalAuxLoss};
  c.aux_loss_coeff = {1.0};
  IdentityRouter r(c);
  Router::Stash st;
  const double l3 = std::log(3.0);
  // Micro-batch 1: counts [0, 2]; micro-batch 2 routes both tokens to expert 0: counts [2, 0].
  r.router.forward(rows({{0, l3}, {0, l3}}), 2, 1, true, st);
  EXPECT_NEAR(st.aux_loss_total, 2.0 / 4.0 * (1.5 * 2), 1e-15);
  r.router.forward(rows({{l3, 0}, {l3, 0}}), 2, 1, true, st);
  // Running mean of counts = [1, 1]; A = [1.5, 0.5] → L = 2/4·(1.5 + 0.5) = 1.
  EXPECT_NEAR(st.aux_loss_total, 1.0, 1e-15);
  r.router.finish_global_batch();  // resets the running counts
  r.router.forward(rows({{l3, 0}, {l3, 0}}), 2, 1, true, st);
  EXPECT_NEAR(st.aux_loss_total, 2.0 / 4.0 * (1.5 * 2), 1e-15);
}

TEST(Router, UniformRoutingGivesAuxLossExactlyOne) {
  for (auto sf : {moe::ScoreFunction::Softmax, moe::ScoreFunction::Sigmoid})
    for (auto type :
         {moe::LoadBalancingType::AuxLoss, moe::LoadBalancingType::SeqAuxLoss, moe::LoadBalancingType::GlobalAuxLoss}) {
      RouterConfig c;
      c.num_experts = 8;
      c.topk = 2;
      c.score_function = sf;
      c.load_balancing = {type};
      c.aux_loss_coeff = {1e-2};
      IdentityRouter r(c);
      Router::Stash st;
      r.router.forward(Tensor::zeros({16, 8}, DType::F64), 4, 4, true, st);
      const nn::RoutingStats& stats = r.router.stats();
      EXPECT_DOUBLE_EQ(stats.loss_sums[0], 1.0) << moe::load_balancing_name(type);
      EXPECT_NEAR(stats.entropy(), std::log(8.0), 1e-12);
    }
}

TEST(Router, CapacityDropsAndPads) {
  RouterConfig c;
  c.num_experts = 4;
  c.topk = 2;
  c.capacity_factor = 1.0;  // C = ceil(2·8/4·1) = 4
  EXPECT_EQ(moe::expert_capacity(c, 8), 4);
  std::vector<std::vector<double>> logit_rows;
  for (int t = 0; t < 8; t++) logit_rows.push_back({5.0 + 0.1 * t, 1.0, 0.0, -1.0});  // all prefer 0, then 1
  for (auto policy : {moe::DropPolicy::Probs, moe::DropPolicy::Position}) {
    c.drop_policy = policy;
    c.pad_to_capacity = false;
    IdentityRouter r(c);
    Router::Stash st;
    auto out = r.router.forward(rows(logit_rows), 8, 1, true, st);
    const nn::RoutingStats& stats = r.router.stats();
    EXPECT_EQ(stats.tokens_per_expert[0], 4);
    EXPECT_EQ(stats.tokens_per_expert[1], 4);
    EXPECT_EQ(stats.dropped, 8);
    // probs keeps the largest probabilities (latest tokens here), position the earliest tokens.
    const int64_t first_kept = policy == moe::DropPolicy::Probs ? 4 : 0;
    for (int64_t t = 0; t < 8; t++) {
      const bool kept = t >= first_kept && t < first_kept + 4;
      EXPECT_EQ(routed(out, t, 0), kept ? 1.0 : 0.0) << "token " << t;
      if (!kept) {
        EXPECT_EQ(prob(out, t, 0), 0.0);
      }
    }
    c.pad_to_capacity = true;
    IdentityRouter rp(c);
    auto outp = rp.router.forward(rows(logit_rows), 8, 1, true, st);
    EXPECT_EQ(outp.pad_capacity, 4);
    // Padding is applied by the dispatcher: every expert gets C rows, the padding ones at probability 0.
    moe::LocalTokenDispatcher d(4);
    moe::DispatchPlan plan;
    Tensor x_RH, p_R;
    d.dispatch(Tensor::zeros({8, 4}, DType::F64), outp, plan, x_RH, p_R);
    for (int64_t e = 0; e < 4; e++)
      EXPECT_EQ(plan.tokens_per_expert[e], 4) << "every expert receives exactly C rows when padded";
    const int64_t first3 = 12;  // expert 3's first row: token 0, a padding row
    EXPECT_EQ(plan.row_token_R.item(first3), 0.0);
    EXPECT_EQ(p_R.item(first3), 0.0) << "padding rows carry probability 0";
  }
}

TEST(Router, ExpertBiasSignRuleOncePerGlobalBatch) {
  RouterConfig c;
  c.num_experts = 4;
  c.topk = 1;
  c.score_function = moe::ScoreFunction::Sigmoid;
  c.enable_expert_bias = true;
  c.bias_update_rate = 0.01;
  IdentityRouter r(c);
  Router::Stash st;
  // Two micro-batches: expert 0 gets 3 tokens, expert 1 gets 1, experts 2 and 3 get 2 each (mean 2).
  r.router.forward(rows({{5, 0, 0, 0}, {5, 0, 0, 0}, {0, 0, 5, 0}, {0, 0, 0, 5}}), 4, 1, true, st);
  r.router.forward(rows({{5, 0, 0, 0}, {0, 5, 0, 0}, {0, 0, 5, 0}, {0, 0, 0, 5}}), 4, 1, true, st);
  for (int e = 0; e < 4; e++) EXPECT_EQ(r.router.expert_bias().item(e), 0.0) << "no update inside a global batch";
  EXPECT_EQ(r.router.local_tokens_per_expert().item(0), 3.0);
  r.router.finish_global_batch();
  EXPECT_FLOAT_EQ(static_cast<float>(r.router.expert_bias().item(0)), -0.01f);  // overloaded: pushed down
  EXPECT_FLOAT_EQ(static_cast<float>(r.router.expert_bias().item(1)), 0.01f);   // underloaded: pushed up
  EXPECT_EQ(r.router.expert_bias().item(2), 0.0);                               // at the mean: unchanged
  EXPECT_EQ(r.router.local_tokens_per_expert().item(0), 0.0) << "counts reset after the update";
  // Evaluation forwards do not count.
  r.router.forward(rows({{5, 0, 0, 0}}), 1, 1, false, st);
  EXPECT_EQ(r.router.local_tokens_per_expert().item(0), 0.0);
}

TEST(Router, JitterStaysInBandAndChangesPerStep) {
  RouterConfig c;
  c.num_experts = 4;
  c.topk = 2;
  c.input_jitter_eps = 0.1;
  IdentityRouter r(c);
  Router::Stash st1, st2;
  Tensor x = testing::randn({6, 4}, DType::F64, 1);
  r.router.forward(x, 6, 1, true, st1);
  r.router.forward(x, 6, 1, true, st2);
  double maxdiff = 0;
  for (int64_t i = 0; i < 24; i++) {
    const double u = st1.jitter_TH.item(i);
    EXPECT_GE(u, 0.9);
    EXPECT_LE(u, 1.1);
    EXPECT_NEAR(st1.logits_TE.item(i), x.item(i) * u, 1e-15);
    maxdiff = std::max(maxdiff, std::fabs(u - st2.jitter_TH.item(i)));
  }
  EXPECT_GT(maxdiff, 0.0);
  Router::Stash ev;
  r.router.forward(x, 6, 1, false, ev);
  EXPECT_FALSE(ev.jitter_TH.defined()) << "no jitter outside training";
}

TEST(Router, RejectsBadConfigurations) {
  RouterConfig c;
  c.hidden = 8;
  c.num_experts = 4;
  c.topk = 1;
  EXPECT_THROW(moe::validate(c), Error);  // softmax, k=1, post
  c.topk = 5;
  EXPECT_THROW(moe::validate(c), Error);
  c.topk = 2;
  c.enable_expert_bias = true;
  EXPECT_THROW(moe::validate(c), Error);  // bias needs sigmoid
  c.enable_expert_bias = false;
  c.num_groups = 3;
  c.group_topk = 1;
  EXPECT_THROW(moe::validate(c), Error);  // 4 % 3
  c.num_groups = 0;
  c.group_topk = 0;
  c.aux_loss_coeff = {0.1, 0.2};
  EXPECT_THROW(moe::validate(c), Error);  // one type, two coefficients
  c.aux_loss_coeff = {0.1};
  c.pad_to_capacity = true;
  EXPECT_THROW(moe::validate(c), Error);
  c.pad_to_capacity = false;
  EXPECT_NO_THROW(moe::validate(c));
  EXPECT_THROW(moe::parse_load_balancing_type("quantile_balancing"), Error);
}

}  // namespace
}  // namespace moecore
