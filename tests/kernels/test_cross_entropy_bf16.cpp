// Cross-entropy on bf16 logits: under --bf16 the CPU's output layer writes bf16 logits, as Megatron's bf16
// output layer does, and the cross-entropy computes in f32 from them (Megatron upcasts them). Forward: the loss and
// logsumexp of the f32 values the bf16 logits hold; backward: the bf16 gradient those f32 logits give, written over
// the logits themselves; the vocabulary-parallel forward the same; the model keeps its logits in bf16.
#include <gtest/gtest.h>

#include <cmath>
#include <utility>
#include <vector>

#include "moecore/kernels/cross_entropy.h"
#include "test_util.h"

namespace moecore {
namespace {

using testing::randint;
using testing::randn;

struct Case {
  int64_t T = 37, V = 1031;  // an odd vocabulary: vector tails in every row
  Tensor logits_bf16, logits_f32, targets, g;
  Case() {
    logits_bf16 = randn({T, V}, DType::F32, 11, 4.0).to(DType::BF16);
    logits_f32 = logits_bf16.to(DType::F32);  // exactly the values the bf16 logits hold
    targets = randint({T}, V, 12);
    // Targets at the ends of the backward's 1,024-wide pieces (cross_entropy.cpp kGradPiece) and of the row.
    for (const auto& [t, y] : {std::pair<int64_t, int64_t>{0, 0}, {1, 1023}, {2, 1024}, {3, V - 1}})
      targets.set_item(t, y);
    g = randn({T}, DType::F32, 13, 1e-3);
  }
};

TEST(CrossEntropyBf16, ForwardIsTheF32ForwardOfTheValuesTheLogitsHold) {
  const Case c;
  EXPECT_EQ(kernels::cross_entropy_stats_dtype(DType::BF16), DType::F32);
  Tensor lb = Tensor::empty({c.T}, DType::F32), sb = Tensor::empty({c.T}, DType::F32);
  Tensor lf = Tensor::empty({c.T}, DType::F32), sf = Tensor::empty({c.T}, DType::F32);
  kernels::cross_entropy_forward(c.logits_bf16, c.targets, lb, sb);
  kernels::cross_entropy_forward(c.logits_f32, c.targets, lf, sf);
  EXPECT_LT(testing::max_rel_diff(sb, sf), 1e-6);
  EXPECT_LT(testing::max_rel_diff(lb, lf), 1e-6);
  // And the f64 definition: loss_t = log Σ_v exp(l_tv) − l_t,target.
  for (int64_t t = 0; t < c.T; t += 6) {
    double mx = -1e300, s = 0;
    for (int64_t v = 0; v < c.V; v++) mx = std::max(mx, c.logits_f32.item(t * c.V + v));
    for (int64_t v = 0; v < c.V; v++) s += std::exp(c.logits_f32.item(t * c.V + v) - mx);
    const double lse = mx + std::log(s);
    EXPECT_NEAR(sb.item(t), lse, 1e-5 * std::fabs(lse));
    EXPECT_NEAR(lb.item(t), lse - c.logits_f32.item(t * c.V + static_cast<int64_t>(c.targets.item(t))), 1e-4);
  }
}

TEST(CrossEntropyBf16, BackwardOverwritesTheLogitsWithTheirBf16Gradient) {
  const Case c;
  Tensor loss = Tensor::empty({c.T}, DType::F32), lse = Tensor::empty({c.T}, DType::F32);
  kernels::cross_entropy_forward(c.logits_f32, c.targets, loss, lse);
  Tensor from_f32 = Tensor::empty({c.T, c.V}, DType::BF16);
  kernels::cross_entropy_backward(c.g, c.logits_f32, c.targets, lse, from_f32);
  Tensor in_place = c.logits_bf16.clone();
  kernels::cross_entropy_backward(c.g, in_place, c.targets, lse, in_place);
  // The same f32 row computed from the same values, rounded once: equal up to the exponential's vector tails.
  for (int64_t i = 0; i < in_place.numel(); i++)
    ASSERT_LE(std::fabs(in_place.item(i) - from_f32.item(i)), std::ldexp(std::fabs(from_f32.item(i)), -7) + 1e-30)
        << "element " << i;
  // Against the f64 definition, g_t · (softmax_tv − [v = target]), within bf16 rounding: every row's target, and
  // every 7th element of every 5th row.
  for (int64_t t = 0; t < c.T; t++) {
    const int64_t y = static_cast<int64_t>(c.targets.item(t));
    std::vector<int64_t> cols{y};
    for (int64_t v = 0; t % 5 == 0 && v < c.V; v += 7) cols.push_back(v);
    for (const int64_t v : cols) {
      const double p = std::exp(c.logits_f32.item(t * c.V + v) - lse.item(t));
      const double want = c.g.item(t) * (p - (v == y ? 1.0 : 0.0));
      EXPECT_NEAR(in_place.item(t * c.V + v), want, std::ldexp(std::fabs(want), -7) + 1e-9);
    }
  }
}

TEST(CrossEntropyBf16, VocabularyParallelForwardReadsBf16Logits) {
  const Case c;
  Tensor lp = Tensor::empty({c.T}, DType::F32), sp = Tensor::empty({c.T}, DType::F32);
  Tensor lf = Tensor::empty({c.T}, DType::F32), sf = Tensor::empty({c.T}, DType::F32);
  // One rank holding every column: the reductions are the identity.
  kernels::cross_entropy_forward_vocab_parallel(
      c.logits_bf16, c.targets, 0, c.V, [](Tensor&, bool) {}, lp, sp);
  kernels::cross_entropy_forward(c.logits_f32, c.targets, lf, sf);
  EXPECT_LT(testing::max_rel_diff(sp, sf), 1e-6);
  EXPECT_LT(testing::max_rel_diff(lp, lf), 1e-5);
}

}  // namespace
}  // namespace moecore
