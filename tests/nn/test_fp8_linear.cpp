// FP8 GEMM sites (nn/fp8_gemm.h) inside Linear: forward, data gradient and weight gradient against a float64
// reference that applies the same quantization (its own model of the grids, the recipes' scales and the tiles'
// orientation); delayed scaling's history; the named error of a non-finite operand. Finite differences do not apply
// to quantized math, hence the reference with the same quantized operands.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "moecore/kernels/fp8.h"
#include "moecore/nn/fp8_recipe.h"
#include "moecore/nn/linear.h"
#include "test_util.h"

namespace moecore {
namespace {

using kernels::Fp8Format;

// The nearest value of the format (ties to the even code, saturating), by walking the grid's codes.
double fp8lin_round(double v, Fp8Format f) {
  const int mb = f == Fp8Format::E4M3 ? 3 : 2, bias = f == Fp8Format::E4M3 ? 7 : 15;
  const double mx = f == Fp8Format::E4M3 ? 448.0 : 57344.0, a = std::fabs(v);
  if (a >= mx) return std::copysign(mx, v);
  double lo = 0;
  int lo_code = 0;
  for (int code = 1;; code++) {
    const int e = code >> mb, m = code & ((1 << mb) - 1);
    const double frac = static_cast<double>(m) / (1 << mb);
    const double val = e == 0 ? std::ldexp(frac, 1 - bias) : std::ldexp(1 + frac, e - bias);
    if (val >= a) {
      const double d_lo = a - lo, d_hi = val - a;
      const double r = d_lo < d_hi ? lo : (d_hi < d_lo ? val : (lo_code % 2 == 0 ? lo : val));
      return std::copysign(r, v);
    }
    lo = val, lo_code = code;
  }
}

// x quantized and read back as the recipe does it: per-tensor scale s, or power-of-two scales per br × bc block.
std::vector<double> fp8lin_quant(const Tensor& x, Fp8Format f, bool blockwise, int64_t br, int64_t bc) {
  const Tensor xf = x.as_dtype(DType::F32);
  const int64_t R = xf.rows(), C = xf.cols();
  const float* p = xf.data<float>();
  const double mx = f == Fp8Format::E4M3 ? 448.0 : 57344.0;
  if (!blockwise) br = R, bc = C;
  std::vector<double> out(static_cast<size_t>(R * C));
  for (int64_t r0 = 0; r0 < R; r0 += br)
    for (int64_t c0 = 0; c0 < C; c0 += bc) {
      double amax = 0;
      for (int64_t r = r0; r < std::min(R, r0 + br); r++)
        for (int64_t c = c0; c < std::min(C, c0 + bc); c++) amax = std::max(amax, std::fabs(double{p[r * C + c]}));
      float s = static_cast<float>(mx / amax);
      if (blockwise) s = static_cast<float>(std::ldexp(1.0, static_cast<int>(std::floor(std::log2(mx / amax)))));
      const float inv = 1.0f / s;
      for (int64_t r = r0; r < std::min(R, r0 + br); r++)
        for (int64_t c = c0; c < std::min(C, c0 + bc); c++)
          out[static_cast<size_t>(r * C + c)] =
              static_cast<float>(static_cast<float>(fp8lin_round(static_cast<float>(p[r * C + c] * s), f)) * inv);
    }
  return out;
}

// C[M, N] = Σ_k A(m, k)·B(k, n) in f64, with accessors for the operands' layouts; compared with `got` relative to
// Σ|terms| (f32 accumulation).
template <typename FA, typename FB>
void fp8lin_expect_product(const Tensor& got, int64_t M, int64_t N, int64_t K, FA a, FB b, const char* what) {
  const Tensor g = got.as_dtype(DType::F32);
  for (int64_t m = 0; m < M; m++)
    for (int64_t n = 0; n < N; n++) {
      double sum = 0, mag = 0;
      for (int64_t k = 0; k < K; k++) sum += a(m, k) * b(k, n), mag += std::fabs(a(m, k) * b(k, n));
      ASSERT_NEAR(g.data<float>()[m * N + n], sum, 1e-5 * mag + 1e-30) << what << " at " << m << "," << n;
    }
}

void fp8lin_check(nn::Fp8Recipe recipe, bool hybrid, bool bf16) {
  nn::Fp8Config cfg;
  cfg.recipe = recipe, cfg.hybrid = hybrid, cfg.num_layers = 1;
  const int64_t M = 150, K = 260, N = 140;  // partial 128-blocks along every dimension
  nn::ParamRegistry reg;
  std::unique_ptr<nn::Linear> lin;
  {
    const nn::Fp8ModelScope scope(cfg);
    lin = std::make_unique<nn::Linear>(
        reg, "decoder.layers.0.mlp.linear_fc1",
        nn::LinearConfig{K, N, false, nn::InitRule::normal(0.5), bf16 ? LowPrecision(DType::BF16) : std::nullopt});
  }
  reg.initialize(7);
  const Tensor x = testing::randn({M, K}, DType::F32, 21, 2.0), dy = testing::randn({M, N}, DType::F32, 22, 1e-3);
  nn::Linear::Stash st;
  const Tensor y = lin->forward(x, st);
  const Tensor dx = lin->backward(dy, st);
  const bool bw = recipe == nn::Fp8Recipe::Blockwise;
  const Fp8Format g = hybrid ? Fp8Format::E5M2 : Fp8Format::E4M3;
  const Tensor xin = bf16 ? x.to(DType::BF16) : x, dyin = bf16 ? dy.to(DType::BF16) : dy;
  const Tensor w = bf16 ? lin->weight().value.to(DType::BF16) : lin->weight().value;
  const auto qx = fp8lin_quant(xin, Fp8Format::E4M3, bw, 1, 128), qw = fp8lin_quant(w, Fp8Format::E4M3, bw, 128, 128);
  const auto qdy = fp8lin_quant(dyin, g, bw, 1, 128);
  const auto qx_t = fp8lin_quant(xin, Fp8Format::E4M3, bw, 128, 1), qdy_t = fp8lin_quant(dyin, g, bw, 128, 1);
  auto at = [](const std::vector<double>& v, int64_t cols) {
    return [&v, cols](int64_t i, int64_t j) { return v[static_cast<size_t>(i * cols + j)]; };
  };
  const auto X = at(qx, K), W = at(qw, K), DY = at(qdy, N), XT = at(qx_t, K), DYT = at(qdy_t, N);
  fp8lin_expect_product(
      y, M, N, K, X, [&](int64_t k, int64_t n) { return W(n, k); }, "y = Q(x)·Q(W)ᵀ");
  fp8lin_expect_product(dx, M, K, N, DY, W, "dx = Q(dy)·Q(W)");
  fp8lin_expect_product(
      lin->weight().grad, N, K, M, [&](int64_t n, int64_t m) { return DYT(m, n); }, XT, "dW = Q(dy)ᵀ·Q(x)");
}

TEST(Fp8Linear, TensorwiseE4m3MatchesTheReference) {
  fp8lin_check(nn::Fp8Recipe::Tensorwise, false, false);
}
TEST(Fp8Linear, TensorwiseHybridBf16MatchesTheReference) {
  fp8lin_check(nn::Fp8Recipe::Tensorwise, true, true);
}
TEST(Fp8Linear, BlockwiseMatchesTheReference) {
  fp8lin_check(nn::Fp8Recipe::Blockwise, false, false);
  fp8lin_check(nn::Fp8Recipe::Blockwise, true, true);
}

// Delayed scaling: the first cast uses scale 1; each later one (max / amax_h) / 2^margin from the history before it.
TEST(Fp8Linear, DelayedScalingFollowsTheHistory) {
  nn::Fp8Config cfg;
  cfg.recipe = nn::Fp8Recipe::Delayed, cfg.margin = 1, cfg.amax_history_len = 2, cfg.amax_max = true;
  nn::Fp8Gemm site(cfg, "site", {});
  const Tensor a = testing::randn({8, 16}, DType::F32, 31, 4.0), b = testing::randn({8, 16}, DType::F32, 32, 1.0);
  const Tensor c = testing::randn({8, 16}, DType::F32, 33, 0.5);
  const double aa = kernels::fp8_amax(a), ab = kernels::fp8_amax(b);
  EXPECT_EQ(site.quantize(a, nn::Fp8Operand::Input, false).scale, 1.0f);
  EXPECT_EQ(site.quantize(b, nn::Fp8Operand::Input, false).scale, static_cast<float>(448.0 / aa / 2));
  EXPECT_EQ(site.quantize(c, nn::Fp8Operand::Input, false).scale, static_cast<float>(448.0 / std::max(aa, ab) / 2));
  EXPECT_EQ(site.histories[0].size(), 2u);  // the history keeps amax_history_len entries, newest first
  EXPECT_EQ(site.histories[0][0], kernels::fp8_amax(c));
  EXPECT_EQ(site.scales[1], 1.0f);  // the weight's state is its own
  // most_recent: only the latest amax counts.
  cfg.amax_max = false, cfg.margin = 0;
  nn::Fp8Gemm recent(cfg, "recent", {});
  recent.quantize(a, nn::Fp8Operand::Grad, false);
  recent.quantize(b, nn::Fp8Operand::Grad, false);
  EXPECT_EQ(recent.scales[2], static_cast<float>(448.0 / ab));
}

TEST(Fp8Linear, NonFiniteOperandIsANamedError) {
  nn::Fp8Config cfg;
  cfg.recipe = nn::Fp8Recipe::Tensorwise, cfg.num_layers = 4;
  nn::ParamRegistry reg;
  std::unique_ptr<nn::Linear> lin;
  {
    const nn::Fp8ModelScope scope(cfg);
    lin = std::make_unique<nn::Linear>(reg, "decoder.layers.2.self_attention.linear_proj",
                                       nn::LinearConfig{8, 8, false, nn::InitRule::normal(0.5)});
  }
  reg.initialize(1);
  for (float bad : {std::nanf(""), INFINITY}) {
    Tensor x = testing::randn({4, 8}, DType::F32, 41);
    x.data<float>()[3] = bad;
    nn::Linear::Stash st;
    const std::string e = testing::user_error_of([&] { lin->forward(x, st); });
    EXPECT_NE(e.find("FP8 GEMM decoder.layers.2.self_attention.linear_proj.weight: its input holds"), std::string::npos)
        << e;
    EXPECT_NE(e.find(std::isnan(bad) ? "NaN" : "infinite"), std::string::npos) << e;
  }
  // Sites exist only in the decoder's layers, outside the bf16 first/last layers.
  cfg.bf16_start = 1, cfg.bf16_end = 1;
  const nn::Fp8ModelScope scope(cfg);
  EXPECT_EQ(nn::fp8_gemm_for("decoder.layers.0.mlp.linear_fc1.weight", {}), nullptr);
  EXPECT_NE(nn::fp8_gemm_for("decoder.layers.1.mlp.linear_fc1.weight", {}), nullptr);
  EXPECT_EQ(nn::fp8_gemm_for("decoder.layers.3.mlp.linear_fc1.weight", {}), nullptr);
  EXPECT_EQ(nn::fp8_gemm_for("output_layer.weight", {}), nullptr);
}

}  // namespace
}  // namespace moecore
