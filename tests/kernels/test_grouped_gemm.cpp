// Grouped expert GEMMs through the API on the CPU: each expert's block of rows against an f64 loop, for both weight
// orientations and f32 or bf16 operands; a bf16 output is the f32 product rounded once; rows outside every block are
// not written; the weight gradient accumulates.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "moecore/kernels/elementwise.h"
#include "moecore/kernels/grouped_gemm.h"
#include "test_util.h"

namespace moecore {
namespace {

using testing::randn;

// Rows [0, 2) belong to no expert, then expert 0: 5 rows, expert 1: none, expert 2: 3 rows, then one loose row.
const std::vector<int64_t> kBegin{2, 7, 7}, kRows{5, 0, 3};
constexpr int64_t R = 11, K = 6, N = 4, E = 3;

double w_at(const Tensor& W, bool trans_w, int64_t e, int64_t k, int64_t n) {
  return trans_w ? W.item((e * N + n) * K + k) : W.item((e * K + k) * N + n);
}

TEST(GroupedGemm, EachExpertsRowsAgainstAnF64Loop) {
  for (DType dt : {DType::F32, DType::BF16})
    for (bool trans_w : {false, true}) {
      const Tensor A = randn({R, K}, DType::F32, 1).to(dt);
      const Tensor W = randn(trans_w ? Shape{E, N, K} : Shape{E, K, N}, DType::F32, 2).to(dt);
      Tensor C = Tensor::empty({R, N}, DType::F32);
      kernels::fill_(C, 7.0);
      kernels::grouped_gemm(A, W, trans_w, C, kBegin, kRows);
      for (int64_t e = 0; e < E; e++)
        for (int64_t r = kBegin[e]; r < kBegin[e] + kRows[e]; r++)
          for (int64_t n = 0; n < N; n++) {
            double ref = 0;
            for (int64_t k = 0; k < K; k++) ref += A.item(r * K + k) * w_at(W, trans_w, e, k, n);
            EXPECT_NEAR(C.item(r * N + n), ref, 1e-5 * (1 + std::abs(ref))) << "expert " << e << " row " << r;
          }
      for (int64_t r : {0, 1, 10})
        for (int64_t n = 0; n < N; n++) EXPECT_EQ(C.item(r * N + n), 7.0) << "row " << r << " is no expert's";
    }
}

// bf16 operands into a bf16 output (the GPU experts' fc1, fc2 and data-gradient GEMMs under --bf16, whose reference
// this is): the f32 output's values rounded once (within half a bf16 step of them; oneDNN may pick another kernel for
// the bf16 destination, so not necessarily the same bits); rows of no expert untouched.
TEST(GroupedGemm, Bf16OutputIsTheF32ProductRoundedOnce) {
  for (bool trans_w : {false, true}) {
    const Tensor A = randn({R, K}, DType::F32, 1).to(DType::BF16);
    const Tensor W = randn(trans_w ? Shape{E, N, K} : Shape{E, K, N}, DType::F32, 2).to(DType::BF16);
    Tensor C32 = Tensor::zeros({R, N}, DType::F32), C16 = Tensor::zeros({R, N}, DType::BF16);
    kernels::grouped_gemm(A, W, trans_w, C32, kBegin, kRows);
    kernels::grouped_gemm(A, W, trans_w, C16, kBegin, kRows);
    for (int64_t i = 0; i < R * N; i++)
      EXPECT_LE(std::abs(C16.item(i) - C32.item(i)), 0x1p-8 * std::abs(C32.item(i)) + 1e-30) << "element " << i;
    for (int64_t r : {0, 1, 10})
      for (int64_t n = 0; n < N; n++) EXPECT_EQ(C16.item(r * N + n), 0.0) << "row " << r << " is no expert's";
  }
}

TEST(GroupedGemm, WeightGradientAccumulatesPerExpert) {
  const Tensor dY = randn({R, N}, DType::F32, 3), X = randn({R, K}, DType::F32, 4);
  Tensor dW = randn({E, N, K}, DType::F32, 5);
  const Tensor dW0 = dW.clone();
  kernels::grouped_gemm_wgrad(dY, X, dW, kBegin, kRows);
  for (int64_t e = 0; e < E; e++)
    for (int64_t n = 0; n < N; n++)
      for (int64_t k = 0; k < K; k++) {
        double ref = dW0.item((e * N + n) * K + k);
        for (int64_t r = kBegin[e]; r < kBegin[e] + kRows[e]; r++) ref += dY.item(r * N + n) * X.item(r * K + k);
        EXPECT_NEAR(dW.item((e * N + n) * K + k), ref, 1e-5 * (1 + std::abs(ref)));
      }
}

TEST(GroupedGemm, RefusesBlocksOutsideTheRows) {
  const Tensor A = randn({R, K}, DType::F32, 1), W = randn({E, N, K}, DType::F32, 2);
  Tensor C = Tensor::empty({R, N}, DType::F32);
  try {
    kernels::grouped_gemm(A, W, true, C, {2, 7, 9}, {5, 0, 3});
    ADD_FAILURE() << "rows [9, 12) of 11 were accepted";
  } catch (const InternalError& e) {
    EXPECT_TRUE(testing::contains(e.what(), "expert 2: rows [9, 12) of 11")) << e.what();
  }
}

}  // namespace
}  // namespace moecore
