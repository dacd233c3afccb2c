// AdamW against hand-computed values (PyTorch / Megatron FusedAdam adam_w_mode semantics).
#include <gtest/gtest.h>
#include <omp.h>

#include <array>
#include <cmath>
#include <vector>

#include "moecore/kernels/adamw_update.h"
#include "moecore/kernels/elementwise.h"
#include "test_util.h"

namespace moecore {
namespace {

TEST(AdamW, HandComputedTwoSteps) {
  Tensor p = Tensor::empty({2}, DType::F64), g = Tensor::empty({2}, DType::F64);
  Tensor m = Tensor::zeros({2}, DType::F64), v = Tensor::zeros({2}, DType::F64);
  p.set_item(0, 1.0);
  p.set_item(1, -2.0);
  g.set_item(0, 0.5);
  g.set_item(1, -1.0);
  kernels::AdamWParams hp{0.1, 0.9, 0.999, 1e-8, 0.01};
  kernels::adamw_step(p, g, m, v, hp, 1);
  // Step 1: m̂ = g, v̂ = g², update = lr·g/(|g| + eps) = ±0.1 (eps-adjusted), after decay p·(1 − 0.001).
  EXPECT_NEAR(p.item(0), 1.0 * (1 - 0.001) - 0.1 * 0.5 / (0.5 + 1e-8), 1e-15);
  EXPECT_NEAR(p.item(1), -2.0 * (1 - 0.001) + 0.1 * 1.0 / (1.0 + 1e-8), 1e-15);
  EXPECT_NEAR(m.item(0), 0.05, 1e-15);
  EXPECT_NEAR(v.item(0), 0.001 * 0.25, 1e-15);
  // Step 2 with gradient 0.25 on element 0.
  g.set_item(0, 0.25);
  const double p1 = p.item(0);
  kernels::adamw_step(p, g, m, v, hp, 2);
  const double m2 = 0.9 * 0.05 + 0.1 * 0.25, v2 = 0.999 * 0.00025 + 0.001 * 0.0625;
  const double mhat = m2 / (1 - 0.81), vhat = v2 / (1 - 0.999 * 0.999);
  EXPECT_NEAR(p.item(0), p1 * (1 - 0.001) - 0.1 * mhat / (std::sqrt(vhat) + 1e-8), 1e-14);
}

TEST(AdamW, F32MatchesF64) {
  Tensor p = testing::randn({1000}, DType::F64, 1), g = testing::randn({1000}, DType::F64, 2);
  Tensor m = Tensor::zeros({1000}, DType::F64), v = Tensor::zeros({1000}, DType::F64);
  Tensor p32 = p.to(DType::F32), g32 = g.to(DType::F32), m32 = m.to(DType::F32), v32 = v.to(DType::F32);
  kernels::AdamWParams hp{1e-3, 0.9, 0.95, 1e-8, 0.1};
  for (int s = 1; s <= 3; s++) {
    kernels::adamw_step(p, g, m, v, hp, s);
    kernels::adamw_step(p32, g32, m32, v32, hp, s);
  }
  EXPECT_LT(testing::max_rel_diff(p32, p), 1e-6);
}

// Clipping's coefficient applied as the gradient is read equals scaling the gradient in place first, bitwise.
TEST(AdamW, GradScaleEqualsPrescaledGradient) {
  Tensor p = testing::randn({40000}, DType::F32, 3), g = testing::randn({40000}, DType::F32, 4);
  Tensor m = testing::randn({40000}, DType::F32, 5), v = testing::randn({40000}, DType::F32, 6);
  kernels::scale_(v, 0.0);
  Tensor p2 = p.clone(), g2 = g.clone(), m2 = m.clone(), v2 = v.clone();
  kernels::AdamWParams hp{1e-3, 0.9, 0.95, 1e-8, 0.1};
  const double coeff = 0.37;
  kernels::scale_(g2, coeff);
  kernels::adamw_step(p2, g2, m2, v2, hp, 2);
  hp.grad_scale = coeff;
  kernels::adamw_step(p, g, m, v, hp, 2);
  EXPECT_TRUE(testing::bitwise_equal(p, p2));
  EXPECT_TRUE(testing::bitwise_equal(m, m2));
  EXPECT_TRUE(testing::bitwise_equal(v, v2));
}

// The multi-tensor pass: tensors of awkward sizes (empty, one element, across thread boundaries), each with its own
// weight decay, split over 3 threads, give bitwise what one call per tensor gives.
TEST(AdamW, MultiTensorEqualsOneCallPerTensor) {
  const int threads = omp_get_max_threads();
  omp_set_num_threads(3);
  const std::vector<int64_t> sizes{0, 1, 17, 40001, 5, 100003, 64};
  std::vector<kernels::AdamWTensor> multi;
  std::vector<std::array<Tensor, 4>> single;
  uint64_t seed = 10;
  for (int64_t n : sizes) {
    Tensor p = testing::randn({n}, DType::F32, seed++), g = testing::randn({n}, DType::F32, seed++);
    Tensor m = testing::randn({n}, DType::F32, seed++), v = testing::randn({n}, DType::F32, seed++);
    for (int64_t i = 0; i < n; i++) v.set_item(i, std::fabs(v.item(i)));  // second moments are not negative
    multi.push_back({p, g, m, v, 0.01 * static_cast<double>(multi.size())});
    single.push_back({p.clone(), g.clone(), m.clone(), v.clone()});
  }
  kernels::AdamWParams hp{1e-3, 0.9, 0.95, 1e-8, 0.5};
  hp.grad_scale = 0.7;
  for (int step = 1; step <= 2; step++) {
    kernels::adamw_step_multi(multi, hp, step);
    for (size_t k = 0; k < single.size(); k++) {
      kernels::AdamWParams h = hp;
      h.weight_decay = multi[k].weight_decay;
      kernels::adamw_step(single[k][0], single[k][1], single[k][2], single[k][3], h, step);
    }
  }
  for (size_t k = 0; k < single.size(); k++) {
    EXPECT_TRUE(testing::bitwise_equal(multi[k].param, single[k][0])) << "tensor " << k;
    EXPECT_TRUE(testing::bitwise_equal(multi[k].m, single[k][2])) << "tensor " << k;
    EXPECT_TRUE(testing::bitwise_equal(multi[k].v, single[k][3])) << "tensor " << k;
  }
  omp_set_num_threads(threads);
}

// bf16 moments (Megatron's precision-aware optimizer, TransformerEngine's FusedAdam): each step loads the stored
// moments, computes in f32, updates the parameter from the unrounded f32 moments, and stores them rounded to nearest
// even. Checked against a scalar emulation of exactly that, over two steps.
TEST(AdamW, Bf16MomentsComputeInF32AndStoreRounded) {
  const int64_t n = 5000;
  Tensor p = testing::randn({n}, DType::F32, 40), g = testing::randn({n}, DType::F32, 41);
  Tensor m = Tensor::zeros({n}, DType::BF16), v = Tensor::zeros({n}, DType::BF16);
  std::vector<double> rp(static_cast<size_t>(n)), rm(static_cast<size_t>(n), 0.0), rv(static_cast<size_t>(n), 0.0);
  for (int64_t i = 0; i < n; i++) rp[static_cast<size_t>(i)] = p.item(i);
  const kernels::AdamWParams hp{1e-2, 0.9, 0.95, 1e-8, 0.1};
  for (int step = 1; step <= 2; step++) {
    std::vector<kernels::AdamWTensor> t{{p, g, m, v, hp.weight_decay}};
    kernels::adamw_step_multi(t, hp, step);
    const double bc1 = 1 - std::pow(0.9, step), bc2 = 1 - std::pow(0.95, step);
    for (size_t i = 0; i < rp.size(); i++) {
      const double gi = g.item(static_cast<int64_t>(i));
      const double mi = 0.9 * rm[i] + 0.1 * gi, vi = 0.95 * rv[i] + 0.05 * gi * gi;
      rp[i] = rp[i] * (1 - 1e-2 * 0.1) - 1e-2 * (mi / bc1) / (std::sqrt(vi / bc2) + 1e-8);
      rm[i] = static_cast<double>(bf16_to_float(float_to_bf16(static_cast<float>(mi))));  // stored rounded
      rv[i] = static_cast<double>(bf16_to_float(float_to_bf16(static_cast<float>(vi))));
    }
  }
  double p_err = 0, m_ulps = 0;
  for (size_t i = 0; i < rp.size(); i++) {
    const int64_t k = static_cast<int64_t>(i);
    p_err = std::max(p_err, std::fabs(p.item(k) - rp[i]) / std::max(1e-3, std::fabs(rp[i])));
    // Moments: the f32 arithmetic may round a value just across a bf16 boundary; at most one bf16 step off.
    m_ulps = std::max(m_ulps, std::fabs(m.item(k) - rm[i]) / std::max(1e-30, std::fabs(rm[i]) * 0x1p-7));
    m_ulps = std::max(m_ulps, std::fabs(v.item(k) - rv[i]) / std::max(1e-30, std::fabs(rv[i]) * 0x1p-7));
  }
  EXPECT_LT(p_err, 1e-5);
  EXPECT_LE(m_ulps, 1.0);
  // Stored as bf16 (not f32 that happens to look so): 2 bytes per moment.
  EXPECT_EQ(m.nbytes(), static_cast<size_t>(2 * n));
}

}  // namespace
}  // namespace moecore

namespace moecore {
namespace {

// The update may also write the new parameter rounded to bf16 (the copy bf16 GEMMs read next step): the parameter
// and moments keep the bits of the update without it, and the copy is the rounding of the new parameter, for every
// run boundary the threads split the tensors at.
TEST(AdamW, Bf16CopyOfTheUpdatedParameter) {
  const int threads = omp_get_max_threads();
  omp_set_num_threads(3);
  std::vector<kernels::AdamWTensor> with, without;
  uint64_t seed = 40;
  for (const int64_t n : {int64_t{17}, int64_t{40001}, int64_t{5}}) {
    Tensor p = testing::randn({n}, DType::F32, seed++), g = testing::randn({n}, DType::F32, seed++);
    Tensor m = Tensor::zeros({n}, DType::F32), v = Tensor::zeros({n}, DType::F32);
    with.push_back({p, g, m, v, 0.1, Tensor::empty({n}, DType::BF16)});
    without.push_back({p.clone(), g.clone(), m.clone(), v.clone(), 0.1});
  }
  {  // a copy that starts 3 elements into its buffer: the streaming stores' unaligned head and tail
    const int64_t n = 1030;
    Tensor p = testing::randn({n}, DType::F32, seed++), g = testing::randn({n}, DType::F32, seed++);
    Tensor m = Tensor::zeros({n}, DType::F32), v = Tensor::zeros({n}, DType::F32);
    with.push_back({p, g, m, v, 0.1, Tensor::empty({n + 3}, DType::BF16).slice(3, n)});
    without.push_back({p.clone(), g.clone(), m.clone(), v.clone(), 0.1});
  }
  const kernels::AdamWParams hp{1e-2, 0.9, 0.95, 1e-8, 0.1};
  for (int step = 1; step <= 2; step++) {
    kernels::adamw_step_multi(with, hp, step);
    kernels::adamw_step_multi(without, hp, step);
  }
  for (size_t k = 0; k < with.size(); k++) {
    EXPECT_TRUE(testing::bitwise_equal(with[k].param, without[k].param)) << "tensor " << k;
    EXPECT_TRUE(testing::bitwise_equal(with[k].m, without[k].m)) << "tensor " << k;
    EXPECT_TRUE(testing::bitwise_equal(with[k].v, without[k].v)) << "tensor " << k;
    EXPECT_TRUE(testing::bitwise_equal(with[k].param_bf16, with[k].param.to(DType::BF16))) << "tensor " << k;
  }
  omp_set_num_threads(threads);
}

}  // namespace
}  // namespace moecore
