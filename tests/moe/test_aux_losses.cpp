// Aux losses and z-loss (moe/aux_losses.h) against values computed by hand: each function's L and the gradient it
// injects; the router with many experts and groups against an f64 reference; sizes the router refuses.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>

#include "moecore/kernels/elementwise.h"
#include "moecore/kernels/routing.h"
#include "moecore/moe/aux_losses.h"
#include "moecore/moe/router.h"
#include "test_util.h"

namespace moecore {
namespace {

Tensor f64(int64_t rows, int64_t cols, std::initializer_list<double> v) {
  return testing::tensor_of({rows, cols}, DType::F64, v);
}

Tensor i32(int64_t rows, int64_t cols, std::initializer_list<int> v) {
  Tensor t = Tensor::empty({rows, cols}, DType::I32);
  int64_t i = 0;
  for (int x : v) t.set_item(i++, x);
  return t;
}

TEST(AuxLosses, AuxLossHandComputed) {
  // T=3, E=3, K=2; counts c = [1, 3, 2], Σ_t a = [0.8, 1.1, 1.1]; f = coeff·E/(K·T²) = 0.1·3/18 = 1/60.
  const Tensor a = f64(3, 3, {0.5, 0.3, 0.2, 0.1, 0.6, 0.3, 0.2, 0.2, 0.6});
  const Tensor top = i32(3, 2, {0, 1, 1, 2, 1, 2});
  Tensor da = Tensor::zeros({3, 3}, DType::F64);
  const double L = moe::aux_loss(a, top, 0.1, nullptr, da);
  EXPECT_NEAR(L, (0.8 * 1 + 1.1 * 3 + 1.1 * 2) / 60.0, 1e-15);  // 0.105
  for (int64_t t = 0; t < 3; t++) {
    EXPECT_NEAR(da.item(t * 3 + 0), 1.0 / 60, 1e-16);
    EXPECT_NEAR(da.item(t * 3 + 1), 3.0 / 60, 1e-16);
    EXPECT_NEAR(da.item(t * 3 + 2), 2.0 / 60, 1e-16);
  }
  // The gradient accumulates.
  moe::aux_loss(a, top, 0.1, nullptr, da);
  EXPECT_NEAR(da.item(1), 6.0 / 60, 1e-16);
}

TEST(AuxLosses, SeqAuxLossHandComputed) {
  // S=2, B=2 (token t = s·B + b), E=2, K=1. Sequence 0 = tokens 0, 2: Σa = [0.35, 1.65], c = [0, 2];
  // sequence 1 = tokens 1, 3: Σa = [1.1, 0.9], c = [2, 0]. f = coeff·E/(K·S²·B) = coeff/4.
  const Tensor a = f64(4, 2, {0.25, 0.75, 0.5, 0.5, 0.1, 0.9, 0.6, 0.4});
  const Tensor top = i32(4, 1, {1, 0, 1, 0});
  Tensor da = Tensor::zeros({4, 2}, DType::F64);
  const double coeff = 0.2;
  const double L = moe::seq_aux_loss(a, top, 2, 2, coeff, nullptr, da);
  EXPECT_NEAR(L, coeff / 4 * (1.65 * 2 + 1.1 * 2), 1e-15);
  const double expect[4][2] = {{0, coeff / 2}, {coeff / 2, 0}, {0, coeff / 2}, {coeff / 2, 0}};
  for (int t = 0; t < 4; t++)
    for (int e = 0; e < 2; e++) EXPECT_NEAR(da.item(t * 2 + e), expect[t][e], 1e-16) << t << "," << e;
}

TEST(AuxLosses, GlobalAuxLossRunningMeanAndGradScale) {
  // E=2, K=1, T=2, grad_scale 3. f = coeff·E/(K·T²) = coeff/2.
  const double coeff = 0.1;
  moe::GlobalAuxCounts acc{Tensor::zeros({2}, DType::F64), 0};
  Tensor da = Tensor::zeros({2, 2}, DType::F64);
  // Micro-batch 1: c = [0, 2], Σa = [0.5, 1.5]: L = coeff/2·3; da = 3·coeff/2·c.
  double L = moe::global_aux_loss(f64(2, 2, {0.25, 0.75, 0.25, 0.75}), i32(2, 1, {1, 1}), coeff, nullptr, 3.0, acc, da);
  EXPECT_NEAR(L, coeff / 2 * 3, 1e-15);
  EXPECT_NEAR(da.item(0), 0.0, 1e-16);
  EXPECT_NEAR(da.item(1), 3 * coeff, 1e-15);
  // Micro-batch 2: c = [2, 0]; running mean c̄ = [1, 1], Σa = [1.5, 0.5]: L = coeff/2·2; da = 1.5·coeff each.
  da.zero_();
  L = moe::global_aux_loss(f64(2, 2, {0.75, 0.25, 0.75, 0.25}), i32(2, 1, {0, 0}), coeff, nullptr, 3.0, acc, da);
  EXPECT_NEAR(L, coeff, 1e-15);
  for (int64_t i = 0; i < 4; i++) EXPECT_NEAR(da.item(i), 1.5 * coeff, 1e-15);
  EXPECT_EQ(acc.micro_batches, 2);
  EXPECT_EQ(acc.tokens_E.item(0), 2.0);
}

TEST(AuxLosses, ZLossHandComputedWithGradient) {
  // lse_0 = log(1 + 3) = log 4, lse_1 = 1 + log 2; z = coeff/(T·ranks)·Σ lse², with lse and Σ lse² from the router's
  // per-token op.
  const double l3 = std::log(3.0), coeff = 0.01;
  const Tensor logits = f64(2, 2, {0, l3, 1, 1});
  const double lse0 = std::log(4.0), lse1 = 1 + std::log(2.0);
  kernels::RouterRule rule;
  rule.K = 1;
  rule.pre_softmax = true;
  kernels::RouterRows r;
  r.used_TE = r.logits_TE = logits;
  r.idx_TK = Tensor::empty({2, 1}, DType::I32);
  r.kept_TK = Tensor::empty({2, 1}, DType::I32);
  r.p_TK = Tensor::empty({2, 1}, DType::F64);
  r.probs_TK = Tensor::empty({2, 1}, DType::F64);
  r.scores_TE = Tensor::empty({2, 2}, DType::F64);
  r.lse_T = Tensor::empty({2}, DType::F64);
  r.sums_2 = Tensor::empty({2}, DType::F64);
  kernels::router_rows(rule, r);
  const Tensor& lse = r.lse_T;
  EXPECT_NEAR(lse.item(0), lse0, 1e-15);
  EXPECT_NEAR(lse.item(1), lse1, 1e-15);
  for (int64_t ranks : {1, 2}) {
    const double z = moe::z_loss(r.sums_2.item(1), 2, coeff, ranks);
    const double n = 2.0 * static_cast<double>(ranks);
    EXPECT_NEAR(z, coeff / n * (lse0 * lse0 + lse1 * lse1), 1e-15);
    // dz/dl_te = grad_scale·coeff·2·lse_t/(T·ranks)·softmax(l_t)_e, added to what is there.
    Tensor dl = Tensor::empty({2, 2}, DType::F64);
    for (int64_t i = 0; i < 4; i++) dl.set_item(i, 1.0);
    moe::z_loss_backward(logits, lse, coeff, ranks, 0.5, dl);
    const double sm[2][2] = {{0.25, 0.75}, {0.5, 0.5}}, ls[2] = {lse0, lse1};
    for (int t = 0; t < 2; t++)
      for (int e = 0; e < 2; e++) EXPECT_NEAR(dl.item(t * 2 + e), 1 + 0.5 * coeff * 2 * ls[t] / n * sm[t][e], 1e-15);
  }
}

// Group-limited sigmoid routing over E = 300 experts in 10 groups, against a reference written out here.
TEST(Router, ManyExpertsAndGroupsMatchReference) {
  moe::RouterConfig c;
  c.hidden = 16;
  c.num_experts = 300;
  c.topk = 8;
  c.num_groups = 10;
  c.group_topk = 2;  // 4 experts of each of the 2 best groups
  c.score_function = moe::ScoreFunction::Sigmoid;
  c.enable_expert_bias = true;
  c.router_dtype = DType::F64;
  c.load_balancing = {moe::LoadBalancingType::AuxLoss};
  c.aux_loss_coeff = {1e-2};
  c.z_loss_coeff = 1e-3;
  nn::ParamRegistry reg(DType::F64);
  moe::Router router(reg, "router", c);
  reg.initialize(5);
  for (int64_t e = 0; e < 300; e++) router.expert_bias().set_item(e, 0.01 * static_cast<double>(e % 7));
  const int64_t T = 12, E = 300, K = 8, n = 30;
  const Tensor x = testing::randn({T, 16}, DType::F64, 3);
  moe::Router::Stash st;
  const moe::Router::Output out = router.forward(x, T, 1, true, st);
  for (int64_t t = 0; t < T; t++) {
    std::vector<double> s(E), sel(E);
    for (int64_t e = 0; e < E; e++) {
      s[e] = 1 / (1 + std::exp(-st.logits_TE.item(t * E + e)));
      sel[e] = s[e] + static_cast<float>(0.01 * static_cast<double>(e % 7));
    }
    // Group score: the sum of its top K/g selection scores; the 2 best groups, then the top 8 inside them.
    auto desc = [&](int64_t a, int64_t b) { return sel[a] > sel[b] || (sel[a] == sel[b] && a < b); };
    std::vector<double> gscore(10);
    for (int64_t g = 0; g < 10; g++) {
      std::vector<int64_t> m(n);
      std::iota(m.begin(), m.end(), g * n);
      std::sort(m.begin(), m.end(), desc);
      for (int64_t j = 0; j < 4; j++) gscore[g] += sel[m[j]];
    }
    std::vector<int64_t> groups(10);
    std::iota(groups.begin(), groups.end(), 0);
    std::sort(groups.begin(), groups.end(),
              [&](int64_t a, int64_t b) { return gscore[a] > gscore[b] || (gscore[a] == gscore[b] && a < b); });
    std::vector<int64_t> cand;
    for (int64_t g : {groups[0], groups[1]})
      for (int64_t e = g * n; e < (g + 1) * n; e++) cand.push_back(e);
    std::sort(cand.begin(), cand.end(), desc);
    double z = 0;
    for (int64_t j = 0; j < K; j++) z += s[cand[j]];
    for (int64_t j = 0; j < K; j++) {
      EXPECT_EQ(out.idx_TK.item(t * K + j), static_cast<double>(cand[j])) << "token " << t << " choice " << j;
      EXPECT_NEAR(out.probs_TK.item(t * K + j), s[cand[j]] / (z + 1e-20), 1e-14);
    }
  }
  EXPECT_GT(st.aux_loss_total, 0.0);
  // Backward runs with the same sizes and gives a finite input gradient.
  const Tensor dx = router.backward(testing::randn({T, K}, DType::F64, 4), DType::F64, 1.0, st);
  EXPECT_EQ(dx.shape(), x.shape());
  EXPECT_TRUE(std::isfinite(kernels::sum_squares(dx)));
  router.finish_global_batch();
  EXPECT_EQ(router.last_global_batch().tokens, T);
  EXPECT_EQ(router.last_global_batch().tokens_per_expert.size(), 300u);
  EXPECT_EQ(router.stats().tokens, 0) << "accumulators reset at the global-batch boundary";
}

std::string router_refusal(const moe::RouterConfig& c) {
  try {
    moe::validate(c);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Router, RefusedSizesSayWhichFlagAndWhy) {
  moe::RouterConfig c;
  c.hidden = 8;
  c.num_experts = 300;
  c.topk = 8;
  c.score_function = moe::ScoreFunction::Sigmoid;
  EXPECT_EQ(router_refusal(c), "");
  c.num_experts = int64_t{1} << 32;
  EXPECT_NE(router_refusal(c).find("--num-experts 4294967296 is too large"), std::string::npos) << router_refusal(c);
  c.num_experts = 300;
  c.num_groups = 7;
  c.group_topk = 1;
  EXPECT_NE(router_refusal(c).find("--num-experts 300 must be divisible by --moe-router-num-groups 7"),
            std::string::npos)
      << router_refusal(c);
  c.num_groups = 10;
  c.group_topk = 3;  // 8 not a multiple of 3: Megatron scores each group by its top 8 // 3 = 2
  EXPECT_EQ(router_refusal(c), "");
  c.num_groups = 150;
  c.group_topk = 1;  // 8 experts from one group of 2
  EXPECT_NE(router_refusal(c).find("--moe-router-topk 8 exceeds the 2 experts"), std::string::npos)
      << router_refusal(c);
  c.num_groups = 100;  // 3 experts per group; 8 > 2 groups x 3
  c.group_topk = 2;
  EXPECT_NE(router_refusal(c).find("--moe-router-topk 8 exceeds the 6 experts"), std::string::npos)
      << router_refusal(c);
}

}  // namespace
}  // namespace moecore
