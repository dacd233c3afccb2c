// IEEE half conversions (core/dtype.h) against hand-computed values: round to nearest even at the 10-bit mantissa,
// the largest finite 65504 and overflow to inf from 65520 on, subnormals down to 2^-24 and underflow to signed zero,
// NaN kept quiet; every half widened exactly and back unchanged; Tensor conversions through f32.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>

#include "moecore/core/tensor.h"

namespace moecore {
namespace {

uint16_t h(float f) {
  return float_to_f16(f).bits;
}

TEST(F16, RoundsToNearestEven) {
  EXPECT_EQ(h(1.0f), 0x3C00);
  EXPECT_EQ(h(-2.0f), 0xC000);
  EXPECT_EQ(h(0.1f), 0x2E66);  // 0.1 = 1.6 x 2^-4: mantissa 0.6 x 1024 = 614.4 -> 614 (0x266)
  // 1 + 2^-11 is half-way between 1 and 1 + 2^-10: ties to the even 1; 1 + 3·2^-11 ties up to 1 + 2·2^-10.
  EXPECT_EQ(h(1.0f + 0x1p-11f), 0x3C00);
  EXPECT_EQ(h(1.0f + 3 * 0x1p-11f), 0x3C02);
  EXPECT_EQ(h(1.0f + 0x1p-11f + 0x1p-20f), 0x3C01);    // just above the tie: up
  EXPECT_EQ(h(2047.0f / 1024.0f + 0x1p-11f), 0x4000);  // the carry into the exponent: 1.999... -> 2
}

TEST(F16, OverflowsToInfFrom65520) {
  EXPECT_EQ(h(65504.0f), 0x7BFF);
  EXPECT_EQ(h(65519.0f), 0x7BFF);
  EXPECT_EQ(h(65520.0f), 0x7C00);  // the tie past the largest finite rounds to the even, inf
  EXPECT_EQ(h(1e6f), 0x7C00);
  EXPECT_EQ(h(-1e30f), 0xFC00);
  EXPECT_EQ(h(std::numeric_limits<float>::infinity()), 0x7C00);
  EXPECT_EQ(h(-std::numeric_limits<float>::infinity()), 0xFC00);
}

TEST(F16, SubnormalsAndUnderflow) {
  EXPECT_EQ(h(0x1p-14f), 0x0400);             // the smallest normal
  EXPECT_EQ(h(0x1p-24f), 0x0001);             // the smallest subnormal
  EXPECT_EQ(h(0x1p-25f), 0x0000);             // half of it ties to even: zero
  EXPECT_EQ(h(0x1p-25f + 0x1p-35f), 0x0001);  // just above: the smallest subnormal
  EXPECT_EQ(h(3 * 0x1p-25f), 0x0002);         // 1.5 x 2^-24 ties to the even 2
  EXPECT_EQ(h(-5 * 0x1p-24f), 0x8005);
  EXPECT_EQ(h(0x1p-14f - 0x1p-25f), 0x0400);  // 1023.5 subnormal steps tie up to the smallest normal
  EXPECT_EQ(h(-0.0f), 0x8000);
  EXPECT_EQ(h(1e-30f), 0x0000);
  EXPECT_EQ(f16_to_float(f16{0x0001}), 0x1p-24f);
  EXPECT_EQ(f16_to_float(f16{0x03FF}), 1023 * 0x1p-24f);
  EXPECT_EQ(std::bit_cast<uint32_t>(f16_to_float(f16{0x8000})), 0x80000000u);
}

TEST(F16, NaNStaysNaN) {
  const uint16_t n = h(std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(n & 0x7C00, 0x7C00);
  EXPECT_NE(n & 0x03FF, 0);
  EXPECT_NE(n & 0x0200, 0);                                     // quiet
  EXPECT_NE(h(std::bit_cast<float>(0x7F800001u)) & 0x0200, 0);  // a signalling NaN becomes quiet, not inf
  EXPECT_TRUE(std::isnan(f16_to_float(f16{0x7E00})));
  EXPECT_TRUE(std::isinf(f16_to_float(f16{0x7C00})));
}

TEST(F16, EveryHalfRoundTrips) {
  for (uint32_t b = 0; b < 0x10000; b++) {
    const f16 v{static_cast<uint16_t>(b)};
    const float f = f16_to_float(v);
    if (std::isnan(f)) continue;
    ASSERT_EQ(float_to_f16(f).bits, b) << std::hex << b;
  }
}

TEST(F16, TensorConvertsThroughF32) {
  Tensor x = Tensor::empty({5}, DType::F32);
  const float v[] = {1.0f, 65520.0f, 0x1p-24f, -3.14159f, 1.0f + 0x1p-11f};
  for (int i = 0; i < 5; i++) x.data<float>()[i] = v[i];
  const Tensor half = x.to(DType::F16);
  EXPECT_EQ(half.dtype(), DType::F16);
  EXPECT_EQ(dtype_size(DType::F16), 2u);
  EXPECT_EQ(half.data<f16>()[1].bits, 0x7C00);
  const Tensor back = half.to(DType::F32);
  EXPECT_EQ(back.item(0), 1.0);
  EXPECT_TRUE(std::isinf(back.item(1)));
  EXPECT_EQ(back.item(2), 0x1p-24);
  EXPECT_EQ(back.item(3), static_cast<double>(f16_to_float(float_to_f16(-3.14159f))));
  EXPECT_EQ(back.item(4), 1.0);
  // bf16 <-> f16 through f32: 1 + 2^-7 is exact in both.
  Tensor b = Tensor::empty({1}, DType::BF16);
  b.set_item(0, 1.0 + 0x1p-7);
  EXPECT_EQ(b.to(DType::F16).item(0), 1.0 + 0x1p-7);
}

}  // namespace
}  // namespace moecore
