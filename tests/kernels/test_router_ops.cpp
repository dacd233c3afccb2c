// The router's CPU ops (kernels/routing.h) against values computed by hand: the per-class counts and sums of the
// load-balancing losses, their gradient coefficients, the kept counts, the id mask, the jitter multiply, and the
// entropy and logsumexp sums router_rows reads back. The routing itself is specified by tests/moe/test_router.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <initializer_list>

#include "moecore/kernels/routing.h"
#include "test_util.h"

namespace moecore {
namespace {

TEST(RouterOps, AuxCountsPerClassHandComputed) {
  // T = 4 tokens in G = 2 classes (t mod 2), E = 3, K = 2.
  // Class 0 = tokens 0, 2: top {0, 1}, {1, 2} -> c = [1, 2, 1]; Σa = [0.5 + 0.1, 0.25 + 0.6, 0.25 + 0.3].
  // Class 1 = tokens 1, 3: top {2, 0}, {2, 1} -> c = [1, 1, 2]; Σa = [0.2 + 0.125, 0.3 + 0.375, 0.5 + 0.5].
  for (DType dt : {DType::F32, DType::F64}) {
    const Tensor a = testing::tensor_of({4, 3}, dt, {0.5, 0.25, 0.25, 0.2, 0.3, 0.5, 0.1, 0.6, 0.3, 0.125, 0.375, 0.5});
    const Tensor top = testing::tensor_of({4, 2}, DType::I32, {0, 1, 2, 0, 1, 2, 2, 1});
    Tensor cnt = Tensor::empty({6}, DType::F64), agg = Tensor::empty({6}, DType::F64);
    kernels::router_aux_counts(a, top, 2, cnt, agg);
    const double c[6] = {1, 2, 1, 1, 1, 2};
    const double s[6] = {0.6, 0.85, 0.55, 0.325, 0.675, 1.0};
    for (int i = 0; i < 6; i++) {
      EXPECT_EQ(cnt.item(i), c[i]) << i;
      EXPECT_NEAR(agg.item(i), s[i], 1e-7) << i;
    }
    // One class: the batch-wide counts, the sums of both classes.
    Tensor cnt1 = Tensor::empty({3}, DType::F64), agg1 = Tensor::empty({3}, DType::F64);
    kernels::router_aux_counts(a, top, 1, cnt1, agg1);
    for (int e = 0; e < 3; e++) {
      EXPECT_EQ(cnt1.item(e), c[e] + c[3 + e]) << e;
      EXPECT_NEAR(agg1.item(e), s[e] + s[3 + e], 1e-7) << e;
    }
  }
}

TEST(RouterOps, AddClassCoefAccumulatesPerClass) {
  // T = 3, E = 2, G = 2: tokens 0 and 2 take class 0's row, token 1 class 1's, added to what is there.
  Tensor da = testing::tensor_of({3, 2}, DType::F64, {1, 1, 1, 1, 1, 1});
  kernels::router_add_class_coef(da, testing::tensor_of({4}, DType::F64, {0.5, 0.25, -2, 4}));
  const double want[6] = {1.5, 1.25, -1, 5, 1.5, 1.25};
  for (int i = 0; i < 6; i++) EXPECT_EQ(da.item(i), want[i]) << i;
}

TEST(RouterOps, ExpertCountsSkipDroppedIds) {
  const Tensor ids = testing::tensor_of({3, 2}, DType::I32, {2, 0, -1, 2, 2, -1});
  Tensor counts = Tensor::empty({3}, DType::F64);
  counts.set_item(1, 7);  // overwritten, not added to
  kernels::router_expert_counts(ids, counts);
  EXPECT_EQ(counts.item(0), 1.0);
  EXPECT_EQ(counts.item(1), 0.0);
  EXPECT_EQ(counts.item(2), 3.0);
}

TEST(RouterOps, MaskIdsAndJitterMultiply) {
  const Tensor idx = testing::tensor_of({2, 2}, DType::I32, {3, 1, 0, 2});
  const Tensor kept = testing::tensor_of({2, 2}, DType::I32, {1, 0, 0, 1});
  Tensor ids = Tensor::empty({2, 2}, DType::I32);
  kernels::router_mask_ids(idx, kept, ids);
  const double want[4] = {3, -1, -1, 2};
  for (int i = 0; i < 4; i++) EXPECT_EQ(ids.item(i), want[i]) << i;
  Tensor x = testing::tensor_of({3}, DType::F32, {2, -1, 0.5});
  kernels::router_mul_(x, testing::tensor_of({3}, DType::F32, {0.5, 3, -4}));
  EXPECT_EQ(x.item(0), 1.0);
  EXPECT_EQ(x.item(1), -3.0);
  EXPECT_EQ(x.item(2), -2.0);
}

TEST(RouterOps, RowsSumEntropyAndSquaredLogsumexp) {
  // Softmax over E = 2 of logits [0, log 3] and [1, 1]: aux scores [1/4, 3/4] and [1/2, 1/2], lse log 4 and 1 + log 2.
  const double l3 = std::log(3.0);
  kernels::RouterRule rule;
  rule.K = 1;
  rule.pre_softmax = true;
  kernels::RouterRows r;
  r.used_TE = testing::tensor_of({2, 2}, DType::F64, {0, l3, 1, 1});
  r.logits_TE = r.used_TE;
  r.idx_TK = Tensor::empty({2, 1}, DType::I32);
  r.p_TK = Tensor::empty({2, 1}, DType::F64);
  r.probs_TK = Tensor::empty({2, 1}, DType::F64);
  r.kept_TK = Tensor::empty({2, 1}, DType::I32);
  r.scores_TE = Tensor::empty({2, 2}, DType::F64);
  r.aux_scores_TE = Tensor::empty({2, 2}, DType::F64);
  r.aux_top_TK = Tensor::empty({2, 1}, DType::I32);
  r.lse_T = Tensor::empty({2}, DType::F64);
  r.sums_2 = Tensor::empty({2}, DType::F64);
  kernels::router_rows(rule, r);
  const double lse0 = std::log(4.0), lse1 = 1 + std::log(2.0);
  EXPECT_NEAR(r.lse_T.item(0), lse0, 1e-15);
  EXPECT_NEAR(r.lse_T.item(1), lse1, 1e-15);
  EXPECT_NEAR(r.sums_2.item(1), lse0 * lse0 + lse1 * lse1, 1e-14);
  const double h0 = -(0.25 * std::log(0.25) + 0.75 * std::log(0.75)), h1 = std::log(2.0);
  EXPECT_NEAR(r.sums_2.item(0), h0 + h1, 1e-15);
  EXPECT_EQ(r.aux_top_TK.item(0), 1.0);
  EXPECT_EQ(r.aux_top_TK.item(1), 0.0);  // a tie goes to the lower expert
  EXPECT_EQ(r.idx_TK.item(0), 1.0);
  EXPECT_NEAR(r.probs_TK.item(0), 0.75, 1e-15);
  EXPECT_EQ(r.kept_TK.item(1), 1.0);
}

}  // namespace
}  // namespace moecore
