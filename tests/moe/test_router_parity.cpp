// Router parity with Megatron-Core on its finer points: group-limited top-k when
// --moe-router-group-topk does not divide --moe-router-topk (moe_utils.group_limited_topk), --moe-router-num-groups
// alone (no group limit), and the expert-bias counts under --moe-pad-expert-input-to-capacity (router.py
// _apply_expert_bias counts the padded capacity mask).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "moecore/moe/router.h"
#include "router_util.h"
#include "test_util.h"

namespace moecore {
namespace {

using moe::Router;
using moe::RouterConfig;

using testing::IdentityRouter;
using testing::rows;
using testing::sig;

std::vector<int64_t> sorted_ids(const Router::Output& o, int64_t t) {
  const int64_t K = o.idx_TK.dim(1);
  std::vector<int64_t> v;
  for (int64_t j = 0; j < K; j++) v.push_back(static_cast<int64_t>(o.idx_TK.item(t * K + j)));
  std::sort(v.begin(), v.end());
  return v;
}

// Indices of the k largest of v (restricted to `allowed`), ties to the lower index.
std::vector<int64_t> topk(const std::vector<double>& v, int64_t k, const std::vector<bool>& allowed) {
  std::vector<int64_t> i;
  for (int64_t e = 0; e < static_cast<int64_t>(v.size()); e++)
    if (allowed[static_cast<size_t>(e)]) i.push_back(e);
  std::stable_sort(i.begin(), i.end(), [&](int64_t a, int64_t b) { return v[a] > v[b]; });
  i.resize(static_cast<size_t>(k));
  return i;
}

// Megatron's group_limited_topk, written out: group score = sum of its top (topk // group_topk) scores.
std::vector<int64_t> megatron_group_topk(const std::vector<double>& s, int64_t k, int64_t G, int64_t g) {
  const int64_t n = static_cast<int64_t>(s.size()) / G;
  std::vector<double> gs(static_cast<size_t>(G), 0.0);
  for (int64_t grp = 0; grp < G; grp++) {
    std::vector<double> in(s.begin() + grp * n, s.begin() + (grp + 1) * n);
    std::sort(in.begin(), in.end(), std::greater<>());
    for (int64_t j = 0; j < k / g; j++) gs[static_cast<size_t>(grp)] += in[static_cast<size_t>(j)];
  }
  std::vector<bool> allowed(s.size(), false);
  for (int64_t grp : topk(gs, g, std::vector<bool>(static_cast<size_t>(G), true)))
    for (int64_t e = grp * n; e < (grp + 1) * n; e++) allowed[static_cast<size_t>(e)] = true;
  std::vector<int64_t> r = topk(s, k, allowed);
  std::sort(r.begin(), r.end());
  return r;
}

// topk 4 with group-topk 3 (the brief's case): 4 groups of 2, each scored by its single best expert (4 // 3 = 1).
// Group D = {-5, 2.95} beats C = {2.9, 2.8} on its best expert, though C's top-2 sum is larger; so the experts
// come from A, B and D: 0 (9), 2 (3), 3 (3), 7 (2.95).
TEST(RouterParity, GroupTopKNotDividingTopKScoresByTopKFloorDiv) {
  RouterConfig c;
  c.num_experts = 8;
  c.topk = 4;
  c.num_groups = 4;
  c.group_topk = 3;
  c.score_function = moe::ScoreFunction::Sigmoid;
  EXPECT_NO_THROW(moe::validate((c.hidden = 8, c)));
  IdentityRouter r(c);
  Router::Stash st;
  const auto out = r.router.forward(rows({{9, -10, 3, 3, 2.9, 2.8, -5, 2.95}}), 1, 1, false, st);
  EXPECT_EQ(sorted_ids(out, 0), (std::vector<int64_t>{0, 2, 3, 7}));
  // Probabilities: sigmoid scores renormalized over the 4 selected.
  const double z = sig(9) + 2 * sig(3) + sig(2.95);
  for (int64_t j = 0; j < 4; j++) {
    const int64_t e = static_cast<int64_t>(out.idx_TK.item(j));
    const double l[] = {9, -10, 3, 3, 2.9, 2.8, -5, 2.95};
    EXPECT_NEAR(out.probs_TK.item(j), sig(l[e]) / z, 1e-15);
  }
}

// Megatron's formula on random scores for every (topk, group-topk) with 12 experts in 4 and 6 groups, including
// topk < group-topk (every group scores 0: the lower-indexed groups win the tie).
TEST(RouterParity, GroupLimitedTopKMatchesMegatronFormula) {
  const int64_t E = 12, T = 24;
  const Tensor x = testing::randn({T, E}, DType::F64, 11);
  int checked = 0;
  for (int64_t G : {4, 6})
    for (int64_t g = 1; g <= G; g++)
      for (int64_t k = 1; k <= g * (E / G); k++) {
        RouterConfig c;
        c.num_experts = E;
        c.topk = k;
        c.num_groups = G;
        c.group_topk = g;
        c.score_function = moe::ScoreFunction::Sigmoid;
        IdentityRouter r(c);
        Router::Stash st;
        const auto out = r.router.forward(x, T, 1, false, st);
        for (int64_t t = 0; t < T; t++) {
          std::vector<double> s(static_cast<size_t>(E));
          for (int64_t e = 0; e < E; e++) s[static_cast<size_t>(e)] = sig(x.item(t * E + e));
          ASSERT_EQ(sorted_ids(out, t), megatron_group_topk(s, k, G, g)) << "G " << G << " g " << g << " k " << k;
        }
        checked++;
      }
  EXPECT_GT(checked, 40);
}

// --moe-router-num-groups without --moe-router-group-topk: Megatron routes over all experts.
TEST(RouterParity, NumGroupsAloneRoutesOverAllExperts) {
  RouterConfig c;
  c.num_experts = 4;
  c.topk = 2;
  c.num_groups = 2;
  c.score_function = moe::ScoreFunction::Sigmoid;
  IdentityRouter r(c);
  Router::Stash st;
  const auto out = r.router.forward(rows({{5, -10, 4, 3.9}}), 1, 1, false, st);
  EXPECT_EQ(sorted_ids(out, 0), (std::vector<int64_t>{0, 2}));  // group-limited would give {2, 3}
  c.hidden = 4;
  c.group_topk = 1;
  c.num_groups = 0;
  try {
    moe::validate(c);
    ADD_FAILURE() << "--moe-router-group-topk without --moe-router-num-groups accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--moe-router-group-topk 1 needs --moe-router-num-groups"), std::string::npos)
        << e.what();
  }
}

// Under --moe-pad-expert-input-to-capacity Megatron counts the padded capacity mask for the expert bias: every
// expert counts its capacity and the bias stays put, however skewed the routing. Without padding the same routing
// moves it (the control).
TEST(RouterParity, ExpertBiasCountsPaddedCapacityAsMegatron) {
  const std::vector<std::vector<double>> skewed = {{3, 2, -1, -2}, {3, 2, -1, -2}, {3, -1, 2, -2}, {2, 3, -1, -2}};
  for (bool pad : {true, false}) {
    RouterConfig c;
    c.num_experts = 4;
    c.topk = 2;
    c.score_function = moe::ScoreFunction::Sigmoid;
    c.enable_expert_bias = true;
    c.bias_update_rate = 0.25;
    c.capacity_factor = 1.0;  // C = ceil(2·4/4) = 2
    c.pad_to_capacity = pad;
    IdentityRouter r(c);
    Router::Stash st;
    const auto out = r.router.forward(rows(skewed), 4, 1, true, st);
    const Tensor& cnt = r.router.local_tokens_per_expert();
    // Kept assignments: expert 0 keeps 2 of 4, expert 1 keeps 2 of 3, expert 2 its 1, expert 3 none.
    const std::vector<double> kept = {2, 2, 1, 0};
    for (int64_t e = 0; e < 4; e++) EXPECT_EQ(cnt.item(e), pad ? 2.0 : kept[static_cast<size_t>(e)]) << e;
    // The statistics still count the real kept assignments.
    EXPECT_EQ(r.router.stats().tokens_per_expert, (std::vector<int64_t>{2, 2, 1, 0}));
    r.router.finish_global_batch();
    const Tensor& b = r.router.expert_bias();
    const std::vector<double> moved = {-0.25, -0.25, 0.25, 0.25};  // mean 1.25
    for (int64_t e = 0; e < 4; e++) EXPECT_EQ(b.item(e), pad ? 0.0 : moved[static_cast<size_t>(e)]) << e;
    (void)out;
  }
}

// --moe-router-load-balancing-type sinkhorn (router.py sinkhorn_load_balancing): in training the experts are the
// top-k of the Sinkhorn-balanced cost (tests/moe/test_sinkhorn.cpp has its values for these logits: arg-max 1, 2,
// 0, 2 where the logits' own arg-max is 0 everywhere), the probabilities the sigmoid of the chosen logit for top-1;
// in evaluation the top-k of the activation itself. Top-2: softmax over all experts, the chosen values unnormalised.
TEST(RouterParity, SinkhornChoosesBalancedExpertsInTrainingOnly) {
  const std::vector<std::vector<double>> l = {{2.0, 0.5, -1.0}, {1.5, 0.2, 0.3}, {3.0, -0.5, 0.0}, {0.1, 0.0, -0.2}};
  RouterConfig c;
  c.num_experts = 3;
  c.topk = 1;
  c.load_balancing = {moe::LoadBalancingType::Sinkhorn};
  c.aux_loss_coeff = {0.0};
  IdentityRouter r(c);
  Router::Stash st;
  const auto train = r.router.forward(rows(l), 4, 1, true, st);
  const std::vector<int64_t> balanced = {1, 2, 0, 2};
  for (int64_t t = 0; t < 4; t++) {
    EXPECT_EQ(train.idx_TK.item(t), balanced[static_cast<size_t>(t)]) << t;
    EXPECT_NEAR(train.probs_TK.item(t), sig(l[t][balanced[static_cast<size_t>(t)]]), 1e-12) << t;
  }
  Router::Stash st2;
  const auto eval = r.router.forward(rows(l), 4, 1, false, st2);
  for (int64_t t = 0; t < 4; t++) {
    EXPECT_EQ(eval.idx_TK.item(t), 0) << t;
    EXPECT_NEAR(eval.probs_TK.item(t), sig(l[t][0]), 1e-12) << t;
  }
  c.topk = 2;
  IdentityRouter r2(c);
  Router::Stash st3;
  const auto top2 = r2.router.forward(rows(l), 4, 1, true, st3);
  for (int64_t t = 0; t < 4; t++) {
    double z = 0;
    for (double x : l[t]) z += std::exp(x);
    for (int64_t j = 0; j < 2; j++) {
      const auto e = static_cast<size_t>(top2.idx_TK.item(t * 2 + j));
      EXPECT_NEAR(top2.probs_TK.item(t * 2 + j), std::exp(l[t][e]) / z, 1e-12) << t;
    }
  }
  c.aux_loss_coeff = {1e-2};
  EXPECT_NE(testing::user_error_of([&] { moe::validate(c); }).find("does not support aux loss"), std::string::npos);
  c.aux_loss_coeff = {0.0, 1e-2};
  c.load_balancing = {moe::LoadBalancingType::Sinkhorn, moe::LoadBalancingType::AuxLoss};
  EXPECT_NE(testing::user_error_of([&] { moe::validate(c); }).find("on its own"), std::string::npos);
}

}  // namespace
}  // namespace moecore
