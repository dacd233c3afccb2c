// YaRN RoPE frequencies and concentration factor against an independent float64 NumPy transcription of
// HuggingFace's _compute_yarn_parameters (tests/models/deepseek_v3_reference.py), and the cos/sin tables they give.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "moecore/kernels/rope.h"
#include "test_util.h"

namespace moecore {
namespace {

nlohmann::json yarn_reference(const std::string& args) {
  return nlohmann::json::parse(testing::python_reference("tests/models/deepseek_v3_reference.py yarn " + args));
}

struct YarnCase {
  int64_t dim;
  double base;
  kernels::YarnParams y;
};

TEST(RopeYarn, MatchesHuggingFaceFormulas) {
  auto yp = [](double s, int64_t orig, double bf, double bs, double m, double mad) {
    kernels::YarnParams y;
    y.scaling_factor = s, y.original_max_position_embeddings = orig, y.beta_fast = bf, y.beta_slow = bs;
    y.mscale = m, y.mscale_all_dim = mad;
    return y;
  };
  const std::vector<YarnCase> cases = {
      {64, 10000, yp(40, 4096, 32, 1, 1, 1)},   // DeepSeek-V3's rope part
      {64, 50000, yp(32, 4096, 32, 1, 1, 1)},   // Kimi-K2's
      {16, 10000, yp(4, 64, 32, 1, 0.7, 0.5)},  // both mscales differ: concentration factor != 1
      {8, 10000, yp(4, 64, 32, 1, 0.7, 0)},     // mscale_all_dim 0 (Megatron's form, see the script)
      {32, 1e6, yp(8, 2048, 16, 2, 1, 0)},      // other betas
      {8, 10000, yp(1, 4096, 32, 1, 1, 1)},     // s = 1: plain RoPE, factor 1
      {6, 10, yp(2, 1 << 20, 32, 1, 1, 0)},     // correction range clamped at the top
  };
  for (const auto& c : cases) {
    const nlohmann::json ref = yarn_reference(fmt::format("{} {} {} {} {} {} {} {}", c.dim, c.base, c.y.scaling_factor,
                                                          c.y.original_max_position_embeddings, c.y.beta_fast,
                                                          c.y.beta_slow, c.y.mscale, c.y.mscale_all_dim));
    const std::vector<double> want = ref["inv_freq"].get<std::vector<double>>();
    const std::vector<double> got = kernels::yarn_inv_freq(c.dim, c.base, c.y);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); i++)
      EXPECT_NEAR(got[i], want[i], 1e-14 * std::abs(want[i])) << c.dim << " " << i;
    EXPECT_NEAR(kernels::yarn_concentration_factor(c.y), ref["attention_factor"].get<double>(), 1e-14);
    EXPECT_NEAR(kernels::yarn_get_mscale(c.y.scaling_factor, c.y.mscale_all_dim), ref["softmax_mscale"].get<double>(),
                1e-14);
  }
}

// Hand-derived constants for DeepSeek-V3 (d = 64, base 1e4, s = 40, L0 = 4096, β = 32/1): c(32) = 64·ln(4096/(64π)) /
// (2 ln 1e4) = 10.47…, floor 10; c(1) = 64·ln(4096/(2π)) / (2 ln 1e4) = 22.5…, ceil 23. Pairs below 10 keep
// base^(−2i/64); from 23 on they are divided by 40; pair 16 is blended with γ = 6/13. The softmax scale gains
// (0.1·ln 40 + 1)² = 1.87385421
TEST(RopeYarn, DeepSeekV3Constants) {
  kernels::YarnParams y;
  y.scaling_factor = 40, y.mscale = 1, y.mscale_all_dim = 1;
  const std::vector<double> f = kernels::yarn_inv_freq(64, 10000, y);
  auto plain = [](int i) { return std::pow(10000.0, -2.0 * i / 64); };
  EXPECT_DOUBLE_EQ(f[9], plain(9));
  EXPECT_DOUBLE_EQ(f[23], plain(23) / 40);
  EXPECT_NEAR(f[16], plain(16) / 40 * (6.0 / 13) + plain(16) * (7.0 / 13), 1e-16);
  EXPECT_DOUBLE_EQ(kernels::yarn_concentration_factor(y), 1.0);
  const double m = kernels::yarn_get_mscale(40, 1);
  EXPECT_NEAR(m * m, 1.8738542070926, 1e-12);
}

// The tables: amplitude·cos(s·inv_freq) and amplitude·sin(...).
TEST(RopeYarn, TablesCarryTheConcentrationFactor) {
  kernels::YarnParams y;
  y.scaling_factor = 4, y.original_max_position_embeddings = 64, y.mscale = 0.7, y.mscale_all_dim = 0.5;
  const std::vector<double> f = kernels::yarn_inv_freq(16, 10000, y);
  const double a = kernels::yarn_concentration_factor(y);
  Tensor c, s;
  kernels::rope_tables_from(5, f, a, DType::F64, c, s);
  for (int64_t p = 0; p < 5; p++)
    for (int64_t i = 0; i < 8; i++) {
      EXPECT_DOUBLE_EQ(c.item(p * 8 + i), a * std::cos(static_cast<double>(p) * f[static_cast<size_t>(i)]));
      EXPECT_DOUBLE_EQ(s.item(p * 8 + i), a * std::sin(static_cast<double>(p) * f[static_cast<size_t>(i)]));
    }
}

}  // namespace
}  // namespace moecore
