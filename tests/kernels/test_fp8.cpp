// FP8 quantizer (kernels/fp8.h) against an independent float64 model of the E4M3 and E5M2 grids: every
// representable value decoded from its bit pattern, the midpoints between neighbours (ties to the even code),
// saturation and NaN; the scales; block tiling; amax of bad input.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "moecore/kernels/fp8.h"
#include "test_util.h"

namespace moecore {
namespace {

using kernels::Fp8Format;

struct Fp8Code {
  double value;
  int code;  // the magnitude's bit pattern (sign bit clear)
};

// Positive finite values of the format in increasing order, decoded from bits: E4M3 (bias 7, no infinities,
// S.1111.111 is NaN), E5M2 (bias 15, exponent 31 is inf/NaN).
std::vector<Fp8Code> fp8_test_grid(Fp8Format f) {
  const int mb = f == Fp8Format::E4M3 ? 3 : 2, eb = f == Fp8Format::E4M3 ? 4 : 5, bias = (1 << (eb - 1)) - 1;
  std::vector<Fp8Code> v;
  for (int code = 0; code < (1 << (eb + mb)); code++) {
    const int e = code >> mb, m = code & ((1 << mb) - 1);
    if (f == Fp8Format::E4M3 && e == 15 && m == 7) continue;
    if (f == Fp8Format::E5M2 && e == 31) continue;
    const double frac = static_cast<double>(m) / (1 << mb);
    v.push_back({e == 0 ? std::ldexp(frac, 1 - bias) : std::ldexp(1 + frac, e - bias), code});
  }
  return v;
}

TEST(Fp8Quantizer, EveryValueMidpointAndTieMatchesTheModel) {
  for (Fp8Format f : {Fp8Format::E4M3, Fp8Format::E5M2}) {
    const std::vector<Fp8Code> g = fp8_test_grid(f);
    EXPECT_EQ(g.back().value, f == Fp8Format::E4M3 ? 448.0 : 57344.0);
    EXPECT_EQ(kernels::fp8_max(f), g.back().value);
    for (size_t i = 0; i < g.size(); i++) {
      for (double s : {1.0, -1.0}) {
        const float v = static_cast<float>(s * g[i].value);
        EXPECT_EQ(kernels::fp8_round(v, f), v) << kernels::fp8_format_name(f) << " " << v;
        if (i + 1 == g.size()) continue;
        const double lo = g[i].value, hi = g[i + 1].value, mid = (lo + hi) / 2;
        const double tie = (g[i].code % 2 == 0) ? lo : hi;  // ties to the even code
        EXPECT_EQ(kernels::fp8_round(static_cast<float>(s * mid), f), static_cast<float>(s * tie))
            << kernels::fp8_format_name(f) << " midpoint " << mid;
        const double below = std::nextafter(static_cast<float>(mid), 0.0f);
        const double above = std::nextafter(static_cast<float>(mid), INFINITY);
        EXPECT_EQ(kernels::fp8_round(static_cast<float>(s * below), f), static_cast<float>(s * lo)) << below;
        EXPECT_EQ(kernels::fp8_round(static_cast<float>(s * above), f), static_cast<float>(s * hi)) << above;
      }
    }
    // Saturation (beyond max, and infinities as a saturating cast), signed zero, NaN.
    const float mx = static_cast<float>(kernels::fp8_max(f));
    for (float big : {mx * 1.03f, mx * 1.2f, mx * 1000.0f, std::numeric_limits<float>::max(), INFINITY}) {
      EXPECT_EQ(kernels::fp8_round(big, f), mx);
      EXPECT_EQ(kernels::fp8_round(-big, f), -mx);
    }
    EXPECT_TRUE(std::signbit(kernels::fp8_round(-0.0f, f)));
    EXPECT_TRUE(std::isnan(kernels::fp8_round(std::nanf(""), f)));
    // Below half the smallest subnormal: zero; above it: the smallest subnormal.
    const double sub = g[1].value;
    EXPECT_EQ(kernels::fp8_round(static_cast<float>(sub * 0.49), f), 0.0f);
    EXPECT_EQ(kernels::fp8_round(static_cast<float>(sub * 0.5), f), 0.0f);  // tie to the even code 0
    EXPECT_EQ(kernels::fp8_round(static_cast<float>(sub * 0.51), f), static_cast<float>(sub));
  }
}

TEST(Fp8Quantizer, ScalesFromAmax) {
  EXPECT_EQ(kernels::fp8_scale_from_amax(2.0, Fp8Format::E4M3, false), 224.0f);
  EXPECT_EQ(kernels::fp8_scale_from_amax(3.0, Fp8Format::E4M3, true), 128.0f);  // 149.33 rounded down
  EXPECT_EQ(kernels::fp8_scale_from_amax(0.0, Fp8Format::E5M2, false), 1.0f);
  EXPECT_EQ(kernels::fp8_scale_from_amax(1e-300, Fp8Format::E4M3, false), std::numeric_limits<float>::max());
}

// Tensorwise: x·s rounded, times 1/s, as the model computes it; amax maps to max exactly.
TEST(Fp8Quantizer, TensorwiseMatchesTheModel) {
  const Tensor x = testing::randn({7, 33}, DType::F32, 11, 3.0);
  const double amax = kernels::fp8_amax(x);
  for (Fp8Format f : {Fp8Format::E4M3, Fp8Format::E5M2}) {
    const float s = kernels::fp8_scale_from_amax(amax, f, false);
    Tensor y = Tensor::empty(x.shape(), DType::F32);
    kernels::fp8_quantize_tensorwise(x, f, s, y);
    const std::vector<Fp8Code> g = fp8_test_grid(f);
    for (int64_t i = 0; i < x.numel(); i++) {
      const float xs = x.data<float>()[i] * s;
      double best = 0;  // the nearest grid value by search (ties cannot occur for these random values)
      for (const Fp8Code& c : g)
        if (std::fabs(c.value - std::fabs(xs)) < std::fabs(best - std::fabs(xs))) best = c.value;
      EXPECT_EQ(y.data<float>()[i], static_cast<float>(std::copysign(best, xs)) * (1.0f / s)) << i;
    }
  }
}

// Blockwise: each tile's values use that tile's own power-of-two scale (checked against a tensor quantized per tile
// by hand), for 1 x 128, 128 x 1 and 128 x 128 blocks with partial edge blocks.
TEST(Fp8Quantizer, BlockwiseTilesHaveTheirOwnScales) {
  Tensor x = testing::randn({130, 260}, DType::F32, 12);
  for (int64_t i = 0; i < 260; i++) x.data<float>()[i] *= 1000.0f;  // row 0 huge: its tiles must not leak
  const int64_t shapes[3][2] = {{1, 128}, {128, 1}, {128, 128}};
  for (const auto& b : shapes) {
    Tensor y = Tensor::empty(x.shape(), DType::F32);
    kernels::fp8_quantize_blockwise(x, Fp8Format::E4M3, b[0], b[1], true, y);
    for (int64_t r = 0; r < 130; r++)
      for (int64_t c = 0; c < 260; c++) {
        const int64_t r0 = r / b[0] * b[0], c0 = c / b[1] * b[1];
        double amax = 0;
        for (int64_t i = r0; i < std::min<int64_t>(130, r0 + b[0]); i++)
          for (int64_t j = c0; j < std::min<int64_t>(260, c0 + b[1]); j++)
            amax = std::max(amax, std::fabs(static_cast<double>(x.data<float>()[i * 260 + j])));
        const double s = std::ldexp(1.0, static_cast<int>(std::floor(std::log2(448.0 / amax))));
        const float v = x.data<float>()[r * 260 + c];
        ASSERT_EQ(y.data<float>()[r * 260 + c],
                  static_cast<float>(kernels::fp8_round(static_cast<float>(v * s), Fp8Format::E4M3) / s))
            << b[0] << "x" << b[1] << " at " << r << "," << c;
      }
  }
}

TEST(Fp8Quantizer, AmaxOfBadInput) {
  Tensor x = testing::randn({4, 8}, DType::F32, 13);
  EXPECT_TRUE(std::isfinite(kernels::fp8_amax(x)));
  x.data<float>()[5] = INFINITY;
  EXPECT_TRUE(std::isinf(kernels::fp8_amax(x)));
  x.data<float>()[6] = std::nanf("");
  EXPECT_TRUE(std::isnan(kernels::fp8_amax(x)));
  EXPECT_TRUE(std::isnan(kernels::fp8_amax(x.to(DType::BF16))));
  x.data<float>()[5] = 1e-45f;  // a subnormal f32 stays finite
  x.data<float>()[6] = 0;
  EXPECT_TRUE(std::isfinite(kernels::fp8_amax(x)));
}

}  // namespace
}  // namespace moecore
