// The norms' fused forms (passes removed, numerics unchanged): the residual add fused into the
// forward, the residual gradient added as backward writes dx, and the bf16 output rounded as it is written — each
// bitwise equal to the unfused calls it replaces, for RMSNorm and LayerNorm in f32 and f64; the Norm module's
// forward_add/backward(dres) the same through the module; and an fp64 finite-difference check of the fused pair as one
// function, y = norm(x + r).
#include <gtest/gtest.h>

#include "moecore/kernels/elementwise.h"
#include "moecore/kernels/layernorm.h"
#include "moecore/kernels/rmsnorm.h"
#include "moecore/nn/norm.h"
#include "test_util.h"

namespace moecore {
namespace {

using testing::bitwise_equal;
using testing::randn;

// Forward, plain or fused: y, the (possibly updated) input, the statistics.
struct NormOut {
  Tensor y, x, mean, rstd;
};

NormOut norm_forward(bool layer, const Tensor& x_in, const Tensor* res, DType out, bool fused) {
  const int64_t T = x_in.rows(), H = x_in.cols();
  const DType dt = x_in.dtype();
  const Tensor w = randn({H}, dt, 7), b = randn({H}, dt, 8);
  NormOut o{Tensor::empty(x_in.shape(), fused ? out : dt), x_in.clone(), Tensor::empty({T}, dt),
            Tensor::empty({T}, dt)};
  if (fused && res) {
    if (layer)
      kernels::layernorm_forward_add(o.x, *res, w, b, 1e-5, o.y, o.mean, o.rstd);
    else
      kernels::rmsnorm_forward_add(o.x, *res, w, 1e-5, o.y, o.rstd);
    return o;
  }
  if (fused) {
    if (layer)
      kernels::layernorm_forward(o.x, w, b, 1e-5, o.y, o.mean, o.rstd);
    else
      kernels::rmsnorm_forward(o.x, w, 1e-5, o.y, o.rstd);
    return o;
  }
  if (res) kernels::add_(o.x, *res);
  if (layer)
    kernels::layernorm_forward(o.x, w, b, 1e-5, o.y, o.mean, o.rstd);
  else
    kernels::rmsnorm_forward(o.x, w, 1e-5, o.y, o.rstd);
  if (out != dt) o.y = o.y.to(out);
  return o;
}

class NormFused : public ::testing::TestWithParam<std::tuple<bool, DType>> {};

TEST_P(NormFused, ForwardAddAndBf16OutputGiveTheUnfusedBits) {
  const auto [layer, dt] = GetParam();
  const Tensor x = randn({37, 96}, dt, 1, 3.0), res = randn({37, 96}, dt, 2, 2.0);
  for (const DType out : {dt, DType::BF16}) {
    if (out == DType::BF16 && dt != DType::F32) continue;  // bf16 outputs are for f32 inputs
    for (const Tensor* r : {static_cast<const Tensor*>(nullptr), &res}) {
      const NormOut a = norm_forward(layer, x, r, out, /*fused=*/true);
      const NormOut b = norm_forward(layer, x, r, out, /*fused=*/false);
      const std::string what = std::string(layer ? "LayerNorm" : "RMSNorm") + (r ? " + residual" : "") + " -> " +
                               std::string(dtype_name(out));
      EXPECT_TRUE(bitwise_equal(a.y, b.y)) << what;
      EXPECT_TRUE(bitwise_equal(a.x, b.x)) << what << ": the updated input";
      EXPECT_TRUE(bitwise_equal(a.rstd, b.rstd)) << what;
      if (layer) {
        EXPECT_TRUE(bitwise_equal(a.mean, b.mean)) << what;
      }
      EXPECT_EQ(a.y.dtype(), out);
    }
  }
}

TEST_P(NormFused, BackwardWithTheResidualGradientGivesTheUnfusedBits) {
  const auto [layer, dt] = GetParam();
  const int64_t T = 29, H = 80;
  const Tensor x = randn({T, H}, dt, 3), dy = randn({T, H}, dt, 4), dres = randn({T, H}, dt, 5);
  const NormOut f = norm_forward(layer, x, nullptr, dt, true);
  const Tensor w = randn({H}, dt, 7);
  Tensor dx_a = Tensor::empty({T, H}, dt), dx_b = Tensor::empty({T, H}, dt);
  Tensor dw_a = Tensor::zeros({H}, dt), dw_b = Tensor::zeros({H}, dt);
  Tensor db_a = Tensor::zeros({H}, dt), db_b = Tensor::zeros({H}, dt);
  if (layer) {
    kernels::layernorm_backward(dy, f.x, w, f.mean, f.rstd, dx_a, dw_a, db_a, &dres);
    kernels::layernorm_backward(dy, f.x, w, f.mean, f.rstd, dx_b, dw_b, db_b);
  } else {
    kernels::rmsnorm_backward(dy, f.x, w, f.rstd, dx_a, dw_a, &dres);
    kernels::rmsnorm_backward(dy, f.x, w, f.rstd, dx_b, dw_b);
  }
  kernels::add_(dx_b, dres);
  EXPECT_TRUE(bitwise_equal(dx_a, dx_b));
  EXPECT_TRUE(bitwise_equal(dw_a, dw_b));
  EXPECT_TRUE(bitwise_equal(db_a, db_b));
}

INSTANTIATE_TEST_SUITE_P(Kinds, NormFused,
                         ::testing::Combine(::testing::Bool(), ::testing::Values(DType::F32, DType::F64)),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param) ? "LayerNorm" : "RMSNorm") + "_" +
                                  std::string(dtype_name(std::get<1>(info.param)));
                         });

// Through the module, with zero-centred gamma: forward_add then backward(dres) against forward of (x + r) and
// backward then add_, parameters' gradients included.
TEST(NormModuleFused, ForwardAddAndBackwardDresMatchTheUnfusedModule) {
  for (const nn::NormKind kind : {nn::NormKind::RMSNorm, nn::NormKind::LayerNorm}) {
    nn::ParamRegistry reg_a(DType::F32), reg_b(DType::F32);
    const nn::NormConfig cfg{kind, 1e-5, true};
    nn::Norm na(reg_a, "n", 64, cfg), nb(reg_b, "n", 64, cfg);
    reg_a.initialize(11);
    reg_b.initialize(11);
    for (const auto& p : reg_a.all()) kernels::add_(p->value, randn(p->value.shape(), DType::F32, 12, 0.1));
    for (const auto& p : reg_b.all()) kernels::add_(p->value, randn(p->value.shape(), DType::F32, 12, 0.1));
    const Tensor x = randn({4, 5, 64}, DType::F32, 13), r = randn({4, 5, 64}, DType::F32, 14);
    const Tensor dy = randn({4, 5, 64}, DType::F32, 15), dres = randn({4, 5, 64}, DType::F32, 16);
    nn::Norm::Stash sa, sb;
    Tensor xa = x.clone(), xb = x.clone();
    const Tensor ya = na.forward_add(xa, r, sa, DType::BF16);
    kernels::add_(xb, r);
    const Tensor yb = nb.forward(xb, sb).to(DType::BF16);
    EXPECT_TRUE(bitwise_equal(ya, yb));
    EXPECT_TRUE(bitwise_equal(xa, xb));
    const Tensor dxa = na.backward(dy, sa, &dres);
    Tensor dxb = nb.backward(dy, sb);
    kernels::add_(dxb, dres);
    EXPECT_TRUE(bitwise_equal(dxa, dxb));
    for (size_t i = 0; i < reg_a.all().size(); i++)
      EXPECT_TRUE(bitwise_equal(reg_a.all()[i]->grad, reg_b.all()[i]->grad)) << reg_a.all()[i]->name;
  }
}

// The fused pair as one function of x and r in fp64: y = norm(x + r), L = <y, W> + <x + r, V> (V: the residual
// branch's gradient). Backward(dy = W, dres = V) is dL/d(x + r), which is dL/dx and dL/dr alike.
TEST(NormModuleFused, FusedPairMatchesFiniteDifferences) {
  for (const nn::NormKind kind : {nn::NormKind::RMSNorm, nn::NormKind::LayerNorm}) {
    nn::ParamRegistry reg(DType::F64);
    nn::Norm n(reg, "n", 12, nn::NormConfig{kind, 1e-5, false});
    reg.initialize(3);
    Tensor x = randn({5, 12}, DType::F64, 21), r = randn({5, 12}, DType::F64, 22);
    const Tensor W = randn({5, 12}, DType::F64, 23), V = randn({5, 12}, DType::F64, 24);
    auto loss = [&] {
      nn::Norm::Stash st;
      Tensor s = x.clone();
      const Tensor y = n.forward_add(s, r, st);
      return kernels::dot(y, W) + kernels::dot(s, V);
    };
    nn::Norm::Stash st;
    Tensor s = x.clone();
    n.forward_add(s, r, st);
    const Tensor d = n.backward(W, st, &V);
    EXPECT_LT(testing::fd_rel_error(loss, x, d), testing::kGradTol);
    EXPECT_LT(testing::fd_rel_error(loss, r, d), testing::kGradTol);
  }
}

}  // namespace
}  // namespace moecore
