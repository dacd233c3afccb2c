// FP8 parameters (--fp8-param-gather, nn/fp8_param.h): every FP8 byte encodes and decodes to itself; the cast of a
// master is, bit for bit, the cast the FP8 GEMM makes of the same f32 weight (Fp8Gemm::quantize: tensorwise,
// delayed over several steps, blockwise with partial blocks), and casting that value again with its own scale is
// the identity; a cast split between owners at arbitrary cuts (the distributed optimizer's shards, cutting 128 × 128
// blocks and experts), their partial amaxes reduced by max, reads back as the whole tensor's cast.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "moecore/kernels/fp8.h"
#include "moecore/nn/fp8_param.h"
#include "moecore/nn/parameter.h"
#include "test_util.h"

namespace moecore {
namespace {

using kernels::Fp8Format;

nn::Fp8Config param_config(nn::Fp8Recipe r) {
  nn::Fp8Config c;
  c.recipe = r;
  c.amax_history_len = 3;
  c.amax_max = true;
  c.param_gather = true;
  return c;
}

TEST(Fp8Param, EveryCodeRoundTrips) {
  for (const Fp8Format f : {Fp8Format::E4M3, Fp8Format::E5M2}) {
    int finite = 0;
    for (int c = 0; c < 256; c++) {
      const float v = kernels::fp8_decode(static_cast<uint8_t>(c), f);
      if (!(std::fabs(v) <= kernels::fp8_max(f))) continue;  // E4M3's NaNs, E5M2's infinities and NaNs
      finite++;
      EXPECT_EQ(kernels::fp8_round(v, f), v) << c;  // a value of the grid
      EXPECT_EQ(kernels::fp8_encode(v, f), c) << v;
    }
    EXPECT_EQ(finite, f == Fp8Format::E4M3 ? 254 : 248);  // with both zeros
  }
  EXPECT_EQ(kernels::fp8_decode(0x7E, Fp8Format::E4M3), 448.0f);
  EXPECT_EQ(kernels::fp8_decode(0x01, Fp8Format::E4M3), std::ldexp(1.0f, -9));
  EXPECT_EQ(kernels::fp8_decode(0xFB, Fp8Format::E5M2), -57344.0f);
}

class Fp8ParamRecipes : public ::testing::TestWithParam<nn::Fp8Recipe> {};

TEST_P(Fp8ParamRecipes, CastIsTheGemmsCastAndItsOwnFixedPoint) {
  const nn::Fp8Config cfg = param_config(GetParam());
  auto mine = std::make_shared<nn::Fp8Gemm>(cfg, "w", nn::TPContext{});
  nn::Fp8Gemm gemm(cfg, "w", nn::TPContext{});  // the non-gathered path's site, fed the same masters
  nn::Parameter p;
  p.name = "w";
  p.value = Tensor::zeros({200, 300}, DType::F32);  // partial 128 × 128 blocks along both dimensions
  nn::make_fp8_param(p, {mine}, 200, 300);
  ASSERT_TRUE(p.fp8);
  for (int step = 0; step < 4; step++) {  // delayed: the scale follows the amax history, in both alike
    const Tensor master = testing::randn({200, 300}, DType::F32, 40 + step, 0.02 * (step + 1));
    nn::fp8_cast_whole(p, master);
    const Tensor want = gemm.quantize(master, nn::Fp8Operand::Weight, false).q;
    EXPECT_TRUE(testing::bitwise_equal(p.value, want)) << "step " << step;
    Tensor again = Tensor::empty({200, 300}, DType::F32);
    if (GetParam() == nn::Fp8Recipe::Blockwise)
      kernels::fp8_quantize_blockwise(p.value, Fp8Format::E4M3, 128, 128, true, again);
    else
      kernels::fp8_quantize_tensorwise(p.value, Fp8Format::E4M3, p.fp8->scales()[0], again);
    EXPECT_TRUE(testing::bitwise_equal(again, p.value)) << "step " << step;
    EXPECT_FALSE(testing::bitwise_equal(p.value, master));  // it is a cast
  }
}

TEST_P(Fp8ParamRecipes, ShardedCastReadsBackAsTheWholeCast) {
  const nn::Fp8Config cfg = param_config(GetParam());
  const int64_t E = 2, R = 130, C = 260, n = E * R * C;
  auto sites = [&] {
    return std::vector<std::shared_ptr<nn::Fp8Gemm>>{std::make_shared<nn::Fp8Gemm>(cfg, "e0", nn::TPContext{}),
                                                     std::make_shared<nn::Fp8Gemm>(cfg, "e1", nn::TPContext{})};
  };
  Tensor master = testing::randn({E, R, C}, DType::F32, 7, 0.03);
  master.data<float>()[5] = 0.5f;  // expert 0's amax far above expert 1's
  nn::Parameter whole, split;
  for (nn::Parameter* q : {&whole, &split}) {
    q->value = Tensor::zeros({E, R, C}, DType::F32);
    nn::make_fp8_param(*q, sites(), R, C);
  }
  nn::fp8_cast_whole(whole, master);
  const std::vector<int64_t> cuts = {0, 12345, 33800, 40001, n};  // mid-block, at the expert boundary, mid-row
  std::vector<double> amax(static_cast<size_t>(split.fp8->amax_slots()), 0.0);
  for (size_t k = 0; k + 1 < cuts.size(); k++) {  // each owner's partial amaxes, reduced by max
    std::vector<double> part(amax.size(), 0.0);
    split.fp8->add_amax(master.data<float>() + cuts[k], cuts[k], cuts[k + 1] - cuts[k], part.data());
    for (size_t s = 0; s < amax.size(); s++) amax[s] = std::max(amax[s], part[s]);
  }
  split.fp8->set_scales(amax);
  std::vector<uint8_t> codes(static_cast<size_t>(n));
  for (size_t k = 0; k + 1 < cuts.size(); k++)
    split.fp8->encode(master.data<float>() + cuts[k], cuts[k], cuts[k + 1] - cuts[k], codes.data() + cuts[k]);
  for (size_t k = 0; k + 1 < cuts.size(); k++)
    split.fp8->decode(codes.data() + cuts[k], cuts[k], cuts[k + 1] - cuts[k], split.value.data<float>() + cuts[k]);
  EXPECT_TRUE(testing::bitwise_equal(split.value, whole.value));
  EXPECT_EQ(split.fp8->scales(), whole.fp8->scales());
  if (GetParam() == nn::Fp8Recipe::Tensorwise) {
    EXPECT_NE(whole.fp8->scales()[0], whole.fp8->scales()[1]);
  }
}

INSTANTIATE_TEST_SUITE_P(FP8, Fp8ParamRecipes,
                         ::testing::Values(nn::Fp8Recipe::Tensorwise, nn::Fp8Recipe::Delayed, nn::Fp8Recipe::Blockwise),
                         [](const auto& info) {
                           return info.param == nn::Fp8Recipe::Tensorwise ? "tensorwise"
                                  : info.param == nn::Fp8Recipe::Delayed  ? "delayed"
                                                                          : "blockwise";
                         });

}  // namespace
}  // namespace moecore
