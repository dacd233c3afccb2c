// Cross-entropy forward and backward in one pass: training knows the loss's gradient dloss_T before
// forward, so cross_entropy_forward_backward computes each exponential once and leaves the logits' gradient where
// the logits were. Loss and lse as cross_entropy_forward gives them; the gradient equal to cross_entropy_backward's
// up to rounding (f32: 2^-16; bf16: one bf16 ulp), targets in every row exact in their form; f64 is the two
// calls, bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <utility>

#include "moecore/kernels/cross_entropy.h"
#include "test_util.h"

namespace moecore {
namespace {

using testing::randint;
using testing::randn;

struct CeResult {
  Tensor loss, lse, grad;
};

// The separate kernels (the reference) or the fused one on a copy of `logits`.
CeResult ce_run(const Tensor& logits, const Tensor& targets, const Tensor& g, bool fused) {
  const int64_t T = logits.rows();
  const DType st = kernels::cross_entropy_stats_dtype(logits.dtype());
  CeResult r{Tensor::empty({T}, st), Tensor::empty({T}, st), logits.clone()};
  if (fused) {
    kernels::cross_entropy_forward_backward(r.grad, targets, g.to(st), r.loss, r.lse);
  } else {
    kernels::cross_entropy_forward(r.grad, targets, r.loss, r.lse);
    kernels::cross_entropy_backward(g.to(st), r.grad, targets, r.lse, r.grad);
  }
  return r;
}

struct FusedCase {
  int64_t T = 29, V = 1031;  // an odd vocabulary: vector tails in every row
  Tensor logits, targets, g;
  FusedCase() {
    logits = randn({T, V}, DType::F64, 21, 4.0);
    targets = randint({T}, V, 22);
    for (const auto& [t, y] : {std::pair<int64_t, int64_t>{0, 0}, {1, V - 1}}) targets.set_item(t, y);
    g = randn({T}, DType::F64, 23, 1e-3);
  }
};

TEST(CrossEntropyFused, F32AndBf16LogitsGiveTheSeparateKernelsResultsUpToRounding) {
  const FusedCase c;
  for (const DType dt : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor logits = c.logits.to(dt);
    const CeResult want = ce_run(logits, c.targets, c.g, false), got = ce_run(logits, c.targets, c.g, true);
    EXPECT_LT(testing::max_rel_diff(got.lse, want.lse), 1e-6);
    EXPECT_LT(testing::max_rel_diff(got.loss, want.loss), 1e-5);
    // Element by element: within 2^-16 in f32 (both are within ~2^-19 of the f64 definition), or one bf16 ulp (two
    // f32 values that close, rounded: at most 2^-7 of the value).
    const double ulps = dt == DType::BF16 ? std::ldexp(1.0, -7) : std::ldexp(1.0, -16);
    for (int64_t i = 0; i < logits.numel(); i++)
      ASSERT_LE(std::fabs(got.grad.item(i) - want.grad.item(i)), ulps * std::fabs(want.grad.item(i)) + 1e-30)
          << "element " << i;
    // The target's term, g·(p − 1), in every row.
    for (int64_t t = 0; t < c.T; t++) {
      const int64_t y = static_cast<int64_t>(c.targets.item(t));
      const double p = std::exp(logits.to(DType::F64).item(t * c.V + y) - want.lse.item(t));
      const double w = c.g.item(t) * (p - 1.0);
      EXPECT_NEAR(got.grad.item(t * c.V + y), w, 4 * ulps * std::fabs(w) + 1e-12) << "row " << t;
    }
  }
}

TEST(CrossEntropyFused, F64IsTheTwoCallsBitForBit) {
  const FusedCase c;
  const CeResult want = ce_run(c.logits, c.targets, c.g, false), got = ce_run(c.logits, c.targets, c.g, true);
  EXPECT_TRUE(testing::bitwise_equal(got.loss, want.loss));
  EXPECT_TRUE(testing::bitwise_equal(got.lse, want.lse));
  EXPECT_TRUE(testing::bitwise_equal(got.grad, want.grad));
}

TEST(CrossEntropyFused, ALabelOutsideTheVocabularyIsNamed) {
  FusedCase c;
  c.targets.set_item(3, static_cast<double>(c.V));
  Tensor logits = c.logits.to(DType::F32);
  Tensor loss = Tensor::empty({c.T}, DType::F32), lse = Tensor::empty({c.T}, DType::F32);
  EXPECT_THROW(kernels::cross_entropy_forward_backward(logits, c.targets, c.g.to(DType::F32), loss, lse), Error);
}

}  // namespace
}  // namespace moecore
