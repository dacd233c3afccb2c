// The LayerNorm kernel pair (kernels/cpu/layernorm): fp64 finite-difference gradients for x, w and b, golden values
// from the formula, f32 against f64, and rows whose statistics overflow f32 staying finite.
#include <gtest/gtest.h>

#include <cmath>

#include "moecore/kernels/elementwise.h"
#include "moecore/kernels/layernorm.h"
#include "test_util.h"

namespace moecore {
namespace {

using testing::fd_rel_error;
using testing::kGradTol;
using testing::randn;

struct LN {
  Tensor y, mean, rstd;
};
LN run(const Tensor& x, const Tensor& w, const Tensor& b, double eps) {
  LN o{Tensor::empty(x.shape(), x.dtype()), Tensor::empty({x.rows()}, x.dtype()), Tensor::empty({x.rows()}, x.dtype())};
  kernels::layernorm_forward(x, w, b, eps, o.y, o.mean, o.rstd);
  return o;
}

TEST(KernelGrad, LayerNorm) {
  const int64_t T = 6, H = 10;
  Tensor x = randn({T, H}, DType::F64, 1), w = randn({H}, DType::F64, 2), b = randn({H}, DType::F64, 4);
  Tensor W = randn({T, H}, DType::F64, 3);
  for (int64_t j = 0; j < H; j++) x.set_item(j, x.item(j) + 7.0);  // a row far from zero mean
  auto loss = [&] { return kernels::dot(run(x, w, b, 1e-5).y, W); };
  const LN f = run(x, w, b, 1e-5);
  Tensor dx = Tensor::empty({T, H}, DType::F64), dw = Tensor::zeros({H}, DType::F64),
         db = Tensor::zeros({H}, DType::F64);
  kernels::layernorm_backward(W, x, w, f.mean, f.rstd, dx, dw, db);
  EXPECT_LT(fd_rel_error(loss, x, dx), kGradTol);
  EXPECT_LT(fd_rel_error(loss, w, dw), kGradTol);
  EXPECT_LT(fd_rel_error(loss, b, db), kGradTol);
  // Backward accumulates into dw and db.
  Tensor dw2 = dw.clone(), db2 = db.clone();
  kernels::layernorm_backward(W, x, w, f.mean, f.rstd, dx, dw2, db2);
  kernels::scale_(dw, 2.0);
  kernels::scale_(db, 2.0);
  EXPECT_LT(testing::max_rel_diff(dw2, dw), 1e-14);
  EXPECT_LT(testing::max_rel_diff(db2, db), 1e-14);
}

// y = (x − mean)/sqrt(var + eps)·w + b with the biased variance (torch.nn.LayerNorm): [1, 2, 3, 4] has mean 2.5 and
// variance 1.25.
TEST(Kernel, LayerNormGoldenValues) {
  Tensor x = Tensor::empty({1, 4}, DType::F64), w = Tensor::empty({4}, DType::F64), b = Tensor::empty({4}, DType::F64);
  for (int64_t j = 0; j < 4; j++) {
    x.set_item(j, 1.0 + static_cast<double>(j));
    w.set_item(j, 0.5 * static_cast<double>(j + 1));
    b.set_item(j, 0.1 * static_cast<double>(j));
  }
  const double eps = 1e-5;
  const LN o = run(x, w, b, eps);
  EXPECT_DOUBLE_EQ(o.mean.item(0), 2.5);
  EXPECT_DOUBLE_EQ(o.rstd.item(0), 1.0 / std::sqrt(1.25 + eps));
  for (int64_t j = 0; j < 4; j++)
    EXPECT_NEAR(o.y.item(j), (x.item(j) - 2.5) / std::sqrt(1.25 + eps) * w.item(j) + b.item(j), 1e-15);
  // Normalized: mean 0, variance var/(var + eps) before the affine map.
  Tensor ones = Tensor::empty({4}, DType::F64), zeros = Tensor::zeros({4}, DType::F64);
  kernels::fill_(ones, 1.0);
  const LN n = run(x, ones, zeros, 0.0);
  EXPECT_NEAR(kernels::sum(n.y), 0.0, 1e-15);
  EXPECT_NEAR(kernels::sum_squares(n.y) / 4, 1.0, 1e-15);
}

TEST(Kernel, LayerNormF32MatchesF64) {
  const int64_t T = 5, H = 96;  // more than one 64-column block of the weight gradient
  Tensor x = randn({T, H}, DType::F64, 1, 3.0), w = randn({H}, DType::F64, 2), b = randn({H}, DType::F64, 4);
  Tensor dy = randn({T, H}, DType::F64, 3);
  auto f32 = [](const Tensor& t) {
    Tensor o = Tensor::empty(t.shape(), DType::F32);
    for (int64_t i = 0; i < t.numel(); i++) o.set_item(i, t.item(i));
    return o;
  };
  Tensor x32 = f32(x), w32 = f32(w), b32 = f32(b), dy32 = f32(dy);
  const LN a = run(x, w, b, 1e-5), c = run(x32, w32, b32, 1e-5);
  Tensor dx = Tensor::empty(x.shape(), DType::F64), dw = Tensor::zeros({H}, DType::F64),
         db = Tensor::zeros({H}, DType::F64);
  Tensor dx32 = Tensor::empty(x.shape(), DType::F32), dw32 = Tensor::zeros({H}, DType::F32);
  Tensor db32 = Tensor::zeros({H}, DType::F32);
  kernels::layernorm_backward(dy, x, w, a.mean, a.rstd, dx, dw, db);
  kernels::layernorm_backward(dy32, x32, w32, c.mean, c.rstd, dx32, dw32, db32);
  for (auto [r, t] : {std::pair{&a.y, &c.y}, {&dx, &dx32}, {&dw, &dw32}, {&db, &db32}})
    for (int64_t i = 0; i < r->numel(); i++) EXPECT_NEAR(t->item(i), r->item(i), 1e-4 * (1 + std::fabs(r->item(i))));
}

// Rows whose f32 sum or squared deviations overflow (a diverged run's activations) still normalize to the f64
// result.
TEST(Kernel, LayerNormHugeRowsStayFinite) {
  const int64_t H = 8;
  const double rows[3][8] = {{1e30, -2e30, 3e30, 0, 5e29, -1e30, 1e30, 2e30},
                             {3e38, 3e38, 1e38, 2e38, -1e38, 3e38, 0, 1},  // the sum itself overflows
                             {1e-3, 2e-3, -1e-3, 0, 4e-3, 1e-3, -2e-3, 3e-3}};
  Tensor x = Tensor::empty({3, H}, DType::F32), w = Tensor::empty({H}, DType::F32), b = Tensor::empty({H}, DType::F32);
  for (int64_t j = 0; j < H; j++) {
    w.set_item(j, 0.5 + 0.1 * static_cast<double>(j));
    b.set_item(j, 0.01 * static_cast<double>(j));
  }
  for (int64_t t = 0; t < 3; t++)
    for (int64_t j = 0; j < H; j++) x.set_item(t * H + j, rows[t][j]);
  const LN o = run(x, w, b, 1e-5);
  for (int64_t t = 0; t < 3; t++) {
    double mu = 0, var = 0;  // f64 reference from the f32 inputs
    for (int64_t j = 0; j < H; j++) mu += x.item(t * H + j) / H;
    for (int64_t j = 0; j < H; j++) var += (x.item(t * H + j) - mu) * (x.item(t * H + j) - mu) / H;
    for (int64_t j = 0; j < H; j++) {
      const double ref = (x.item(t * H + j) - mu) / std::sqrt(var + 1e-5) * w.item(j) + b.item(j);
      ASSERT_TRUE(std::isfinite(o.y.item(t * H + j))) << "row " << t;
      EXPECT_NEAR(o.y.item(t * H + j), ref, 1e-5 * (1 + std::fabs(ref))) << "row " << t << " column " << j;
    }
  }
}

}  // namespace
}  // namespace moecore
