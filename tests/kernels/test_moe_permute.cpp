// The MoE permutation's CPU ops (kernels/moe_permute.h) on cases worked out by hand: the plan with the experts'
// padded layout and with padding to capacity, the row gathers (f32 rounded to bf16, gap rows zero) and scatters, the
// per-token sum, and the probability moves across dtypes. The dispatchers built on them: tests/moe/.
#include <gtest/gtest.h>

#include <initializer_list>
#include <vector>

#include "moecore/kernels/moe_permute.h"
#include "test_util.h"

namespace moecore {
namespace {

void expect_permute_values(const Tensor& t, std::initializer_list<double> v, const char* what) {
  ASSERT_EQ(t.numel(), static_cast<int64_t>(v.size())) << what;
  int64_t i = 0;
  for (double x : v) {
    EXPECT_EQ(t.item(i), x) << what << " [" << i << "]";
    i++;
  }
}

TEST(MoePermute, PlanInTheExpertsPaddedLayout) {
  // T = 3, K = 2, E = 3, rows aligned to 4. Token 1's first choice is dropped (−1), token 2's first is another
  // rank's expert (5). Expert 0: assignments 1 (t0) and 5 (t2); expert 1: none; expert 2: 0 (t0) and 3 (t1).
  const Tensor idx = testing::tensor_of({3, 2}, DType::I32, {2, 0, -1, 2, 5, 0});
  kernels::PermutePlan plan;
  kernels::moe_permute_plan(idx, 3, 0, 3, 4, plan);
  EXPECT_EQ(plan.tokens_per_expert, (std::vector<int64_t>{2, 0, 2}));
  EXPECT_EQ(plan.R, 8);
  expect_permute_values(plan.row_token_R, {0, 2, -1, -1, 0, 1, -1, -1}, "row_token");
  expect_permute_values(plan.row_tk_R, {1, 5, -1, -1, 0, 3, -1, -1}, "row_tk");
  expect_permute_values(plan.token_offsets_T1, {0, 2, 3, 4}, "token_offsets");
  expect_permute_values(plan.token_rows, {0, 4, 5, 1}, "token_rows");  // each token's rows in ascending expert order
}

TEST(MoePermute, PlanPaddedToCapacityPerSourceBlock) {
  // T = 4 in two blocks of 2 (two source ranks), K = 1, E = 2, capacity 2: every expert gets 2 rows per block, its
  // own first, then the block's earliest tokens without one (no [T, K] entry: row_tk −1).
  const Tensor idx = testing::tensor_of({4, 1}, DType::I32, {0, 0, 1, -1});
  kernels::PermutePlan plan;
  kernels::moe_permute_plan(idx, 2, 2, 2, 1, plan);
  EXPECT_EQ(plan.tokens_per_expert, (std::vector<int64_t>{4, 4}));
  EXPECT_EQ(plan.R, 8);
  expect_permute_values(plan.row_token_R, {0, 1, 2, 3, 0, 1, 2, 3}, "row_token");
  expect_permute_values(plan.row_tk_R, {0, 1, -1, -1, -1, -1, 2, -1}, "row_tk");
  expect_permute_values(plan.token_offsets_T1, {0, 2, 4, 6, 8}, "token_offsets");
  expect_permute_values(plan.token_rows, {0, 4, 1, 5, 2, 6, 3, 7}, "token_rows");
}

TEST(MoePermute, RowGatherRoundsToBf16AndScatterSkipsGapRows) {
  const double third = 1.0 / 3.0;
  const Tensor src = testing::tensor_of({2, 3}, DType::F32, {1, 2, 3, third, -0.5, 1e-3});
  Tensor dst = Tensor::empty({3, 3}, DType::BF16);
  kernels::moe_gather_rows(src, testing::tensor_of({3}, DType::I32, {1, -1, 0}), dst);
  auto bf = [](double v) { return static_cast<double>(bf16_to_float(float_to_bf16(static_cast<float>(v)))); };
  expect_permute_values(dst, {bf(third), -0.5, bf(1e-3), 0, 0, 0, 1, 2, 3}, "gathered rows");
  EXPECT_NE(bf(third), static_cast<double>(static_cast<float>(third)));  // the case rounds
  Tensor back = testing::tensor_of({3, 2}, DType::F32, {9, 9, 9, 9, 9, 9});
  kernels::moe_scatter_rows(testing::tensor_of({3, 2}, DType::F32, {1, 2, 3, 4, 5, 6}),
                            testing::tensor_of({3}, DType::I32, {2, -1, 0}), back);
  expect_permute_values(back, {5, 6, 9, 9, 1, 2}, "scattered rows");
}

TEST(MoePermute, SumRowsPerTokenInF32FromBf16Rows) {
  // Token 0 sums rows 2 and 0, token 1 has none, token 2 row 1.
  const Tensor rows = testing::tensor_of({3, 2}, DType::BF16, {1, 2, 0.5, 0.25, 4, 8});
  Tensor y = Tensor::empty({3, 2}, kernels::moe_row_sum_dtype(DType::BF16));
  ASSERT_EQ(y.dtype(), DType::F32);
  kernels::moe_sum_rows_per_token(rows, testing::tensor_of({4}, DType::I64, {0, 2, 2, 3}),
                                  testing::tensor_of({3}, DType::I32, {2, 0, 1}), y);
  expect_permute_values(y, {5, 10, 0, 0, 0.5, 0.25}, "sums");
}

TEST(MoePermute, ProbabilityMovesConvertAndSkipPaddingRows) {
  const Tensor probs_TK = testing::tensor_of({2, 2}, DType::F64, {0.125, 0.25, 0.5, 0.75});
  const Tensor row_tk = testing::tensor_of({3}, DType::I64, {-1, 3, 0});
  Tensor probs_R = Tensor::empty({3}, DType::F32);
  kernels::moe_gather_probs(probs_TK, row_tk, probs_R);
  expect_permute_values(probs_R, {0, 0.75, 0.125}, "gathered probs");
  Tensor dprobs_TK = testing::tensor_of({2, 2}, DType::F64, {9, 9, 9, 9});
  kernels::moe_scatter_probs(testing::tensor_of({3}, DType::F32, {7, 0.5, -2}), row_tk, dprobs_TK);
  expect_permute_values(dprobs_TK, {-2, 0, 0, 0.5}, "scattered gradients");
}

}  // namespace
}  // namespace moecore
