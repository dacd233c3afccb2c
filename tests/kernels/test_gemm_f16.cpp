// GEMM on f16 operands (--fp16): the products of f16-rounded operands, widened to f32 and accumulated in f32, against
// a float64 reference of the same rounded values; an f16 output is that product rounded once; and a hand-computed
// product whose exact result needs the 11-bit significands (bf16 would round the operands).
#include <gtest/gtest.h>

#include <cmath>

#include "moecore/kernels/gemm.h"
#include "test_util.h"

namespace moecore {
namespace {

using testing::randn;

TEST(GemmF16, HandComputedProductKeepsElevenBitSignificands) {
  // 1 + 2^-10 is exact in f16 (not in bf16): (1 + 2^-10)·(1 - 2^-10) + 2048·(1/2048) = 2 - 2^-20, exact in f32.
  Tensor a = Tensor::empty({1, 2}, DType::F16), b = Tensor::empty({2, 1}, DType::F16);
  a.set_item(0, 1.0 + 0x1p-10);
  a.set_item(1, 2048.0);
  b.set_item(0, 1.0 - 0x1p-10);
  b.set_item(1, 1.0 / 2048.0);
  Tensor c = Tensor::zeros({1, 1}, DType::F32);
  kernels::gemm(a, false, b, false, c);
  EXPECT_EQ(c.item(0), 2.0 - 0x1p-20);
}

struct F16Case {
  int64_t M, N, K;
  bool ta, tb;
};

TEST(GemmF16, MatchesFloat64OfRoundedOperands) {
  for (const F16Case& g : {F16Case{7, 5, 3, false, false}, F16Case{33, 17, 64, false, true},
                           F16Case{64, 48, 96, true, false}, F16Case{20, 30, 40, true, true}}) {
    const Tensor a = randn(g.ta ? Shape{g.K, g.M} : Shape{g.M, g.K}, DType::F32, 11).as_dtype(DType::F16);
    const Tensor b = randn(g.tb ? Shape{g.N, g.K} : Shape{g.K, g.N}, DType::F32, 12).as_dtype(DType::F16);
    Tensor want = Tensor::zeros({g.M, g.N}, DType::F64);
    kernels::gemm(a.to(DType::F64), g.ta, b.to(DType::F64), g.tb, want);  // exact products of the f16 values
    Tensor c = Tensor::zeros({g.M, g.N}, DType::F32);
    kernels::gemm(a, g.ta, b, g.tb, c);
    Tensor c16 = Tensor::empty({g.M, g.N}, DType::F16);
    kernels::gemm(a, g.ta, b, g.tb, c16);
    // f32 accumulation of exact products: within K rounding steps of the sum of |products| (bounded by K·max²).
    const double bound = static_cast<double>(g.K) * 0x1p-23 * static_cast<double>(g.K) * 16.0;
    for (int64_t i = 0; i < g.M * g.N; i++) {
      ASSERT_NEAR(c.item(i), want.item(i), bound) << "element " << i;
      // The f16 output is the f32 product rounded once.
      ASSERT_EQ(c16.item(i), static_cast<double>(f16_to_float(float_to_f16(static_cast<float>(c.item(i))))))
          << "element " << i;
    }
  }
}

TEST(GemmF16, AccumulatesIntoF32WithBeta) {
  const Tensor a = randn({9, 12}, DType::F32, 21).as_dtype(DType::F16);
  const Tensor b = randn({12, 6}, DType::F32, 22).as_dtype(DType::F16);
  const Tensor c0 = randn({9, 6}, DType::F32, 23);
  Tensor want = c0.to(DType::F64);
  kernels::gemm(a.to(DType::F64), false, b.to(DType::F64), false, want, 0.5f, 1.0f);
  Tensor c = c0.clone();
  kernels::gemm(a, false, b, false, c, 0.5f, 1.0f);
  EXPECT_LT(testing::max_rel_diff(c, want.to(DType::F32)), 1e-5);
}

}  // namespace
}  // namespace moecore
