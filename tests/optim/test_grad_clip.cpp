// The clip state on the CPU (kernels/grad_clip.h): the gradient norm's parts summed exactly as the host loop
// `part += w·sum_squares(g)` did, the clip coefficient's formula, the deferred ring of norms and the sticky
// non-finite flag that the GPU keeps in device memory, read back in step order; and the multi-tensor SGD equal to
// one sgd_step per tensor.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "moecore/kernels/elementwise.h"
#include "moecore/kernels/grad_clip.h"
#include "moecore/kernels/sgd_update.h"

namespace moecore {
namespace {

Tensor ramp(int64_t n, float scale) {
  Tensor t = Tensor::empty({n}, DType::F32);
  for (int64_t i = 0; i < n; i++) t.data<float>()[i] = scale * std::sin(static_cast<float>(i) * 0.37f + scale);
  return t;
}

TEST(GradClip, PartsSumAsTheHostLoopAndTheCoefficientIsTheHostFormula) {
  const std::vector<Tensor> dense{ramp(1000, 0.5f), ramp(33, 2.0f), ramp(70000, 0.01f)}, expert{ramp(512, 1.5f)};
  const std::vector<double> wd{1.0, 0.5, 1.0}, we{0.25};
  double p0 = 0, p1 = 0;
  for (size_t i = 0; i < dense.size(); i++) p0 += wd[i] * kernels::sum_squares(dense[i]);
  for (size_t i = 0; i < expert.size(); i++) p1 += we[i] * kernels::sum_squares(expert[i]);
  const double sq = 0.0 + p0 + p1, norm = std::sqrt(sq);
  kernels::ClipState s = kernels::make_clip_state(Device::cpu(), 4);
  kernels::squares_reset(s);
  kernels::squares_add_part(s, dense, wd);
  kernels::squares_add_part(s, expert, we);
  EXPECT_EQ(kernels::squares_total(s), sq);
  for (double clip : {0.0, 1.0, 1e9}) {
    kernels::clip_finish(s, std::nullopt, clip, true, 1, /*defer=*/false);
    ASSERT_TRUE(kernels::norm_on_host(s).has_value());
    EXPECT_EQ(*kernels::norm_on_host(s), norm);
    kernels::AdamWParams hp;
    EXPECT_TRUE(kernels::apply_clip(s, hp));
    EXPECT_FALSE(hp.clip.defined());  // the CPU's update takes the scale from the host
    const double coeff = clip / (norm + 1e-6);
    EXPECT_EQ(hp.grad_scale, clip > 0 && coeff < 1.0 ? coeff : 1.0) << "clip " << clip;
  }
  EXPECT_EQ(s.pending, 0);  // nothing deferred
  // The sum over ranks, given by the host.
  kernels::clip_finish(s, 9.0, 1.0, true, 1, false);
  EXPECT_EQ(*kernels::norm_on_host(s), 3.0);
}

TEST(GradClip, DeferredNormsComeBackInOrderAndANonFiniteOneSkipsEveryLaterStep) {
  kernels::ClipState s = kernels::make_clip_state(Device::cpu(), 3);
  const std::vector<double> w{1.0};
  std::vector<double> want;
  for (int64_t it = 1; it <= 3; it++) {
    Tensor g = ramp(100, static_cast<float>(it));
    if (it == 2) g.data<float>()[7] = INFINITY;
    kernels::squares_reset(s);
    kernels::squares_add_part(s, std::vector<Tensor>{g}, w);
    kernels::clip_finish(s, std::nullopt, 1.0, true, it, /*defer=*/true);
    want.push_back(std::sqrt(kernels::sum_squares(g)));
    kernels::AdamWParams hp;
    EXPECT_EQ(kernels::apply_clip(s, hp), it < 2) << "iteration " << it;  // sticky from iteration 2 on
  }
  EXPECT_EQ(s.pending, 3);
  EXPECT_ANY_THROW(kernels::clip_finish(s, std::nullopt, 1.0, true, 4, true));  // the ring is full: read first
  const kernels::DeferredNorms d = kernels::take_deferred_norms(s);
  ASSERT_EQ(d.norms.size(), 3u);
  EXPECT_EQ(d.norms[0], want[0]);
  EXPECT_TRUE(std::isinf(d.norms[1]));
  EXPECT_EQ(d.norms[2], want[2]);
  EXPECT_EQ(d.first_nonfinite, 2);
  EXPECT_EQ(s.pending, 0);
  // The check off (--no-check-for-nan-in-loss-and-grad): a non-finite norm is applied with scale 1.
  kernels::ClipState off = kernels::make_clip_state(Device::cpu(), 1);
  Tensor g = ramp(10, 1.0f);
  g.data<float>()[3] = NAN;
  kernels::squares_reset(off);
  kernels::squares_add_part(off, std::vector<Tensor>{g}, w);
  kernels::clip_finish(off, std::nullopt, 1.0, false, 1, true);
  kernels::AdamWParams hp;
  EXPECT_TRUE(kernels::apply_clip(off, hp));
  EXPECT_EQ(hp.grad_scale, 1.0);
  EXPECT_EQ(kernels::take_deferred_norms(off).first_nonfinite, 0);
}

TEST(GradClip, MultiTensorSgdEqualsOneStepPerTensor) {
  std::vector<kernels::AdamWTensor> multi, ref;
  for (int k = 0; k < 3; k++) {
    const int64_t n = 50 + 30 * k;
    Tensor p = ramp(n, 1.0f + k), g = ramp(n, 0.3f * (k + 1)), b = ramp(n, 0.01f);
    Tensor pb = k == 1 ? Tensor::zeros({n}, DType::BF16) : Tensor();
    multi.push_back({p, g, b, Tensor(), 0.01 * k, pb});
    ref.push_back({p.clone(), g, b.clone(), Tensor(), 0.01 * k, pb.defined() ? pb.clone() : Tensor()});
  }
  kernels::AdamWParams hp;
  hp.lr = 0.05;
  hp.grad_scale = 0.75;
  kernels::sgd_step_multi(multi, hp, 0.9);
  for (auto& x : ref) {
    kernels::sgd_step(x.param, x.grad, x.m, kernels::SgdParams{0.05, x.weight_decay, 0.9, 0.75});
    if (x.param_bf16.defined()) x.param_bf16.copy_from(x.param);
  }
  for (size_t k = 0; k < ref.size(); k++) {
    EXPECT_EQ(std::memcmp(multi[k].param.raw(), ref[k].param.raw(), multi[k].param.nbytes()), 0);
    EXPECT_EQ(std::memcmp(multi[k].m.raw(), ref[k].m.raw(), multi[k].m.nbytes()), 0);
  }
  EXPECT_EQ(std::memcmp(multi[1].param_bf16.raw(), ref[1].param_bf16.raw(), multi[1].param_bf16.nbytes()), 0);
}

}  // namespace
}  // namespace moecore
