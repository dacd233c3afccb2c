// Activations kept in bf16 between ops: a GEMM that writes its output in bf16 gives the bits of
// the f32 product rounded after (one call, chunked long reductions, batches); an activation reading a bf16 input
// gives the bits of one reading that input widened (forward and backward, every activation, with and without
// probabilities; their row sums to rounding); a Linear given a bf16 input, or asked for a bf16 output, the bits of the
// separate casts.
#include <gtest/gtest.h>

#include "moecore/kernels/activation.h"
#include "moecore/kernels/gemm.h"
#include "moecore/nn/linear.h"
#include "test_util.h"

namespace moecore {
namespace {

using testing::bitwise_equal;
using testing::randn;

TEST(GemmBf16Output, TheF32ProductRounded) {
  struct Case {
    int64_t M, N, K;
    bool ta, tb;
  };
  for (const Case c :
       {Case{64, 96, 80, false, true}, Case{33, 17, 130, true, false}, Case{8, 24, 20000, false, true}}) {
    const Tensor A = randn(c.ta ? Shape{c.K, c.M} : Shape{c.M, c.K}, DType::F32, 1).to(DType::BF16);
    const Tensor B = randn(c.tb ? Shape{c.N, c.K} : Shape{c.K, c.N}, DType::F32, 2).to(DType::BF16);
    Tensor c32 = Tensor::empty({c.M, c.N}, DType::F32), c16 = Tensor::empty({c.M, c.N}, DType::BF16);
    kernels::gemm(A, c.ta, B, c.tb, c32, 0.5f);
    kernels::gemm(A, c.ta, B, c.tb, c16, 0.5f);
    EXPECT_TRUE(bitwise_equal(c16, c32.to(DType::BF16))) << "M=" << c.M << " N=" << c.N << " K=" << c.K;
  }
  const Tensor A = randn({3, 16, 32}, DType::F32, 3).to(DType::BF16),
               B = randn({3, 32, 8}, DType::F32, 4).to(DType::BF16);
  Tensor c32 = Tensor::empty({3, 16, 8}, DType::F32), c16 = Tensor::empty({3, 16, 8}, DType::BF16);
  kernels::gemm_batched(A, false, B, false, c32);
  kernels::gemm_batched(A, false, B, false, c16);
  EXPECT_TRUE(bitwise_equal(c16, c32.to(DType::BF16))) << "batched";
  // Prepared primitives for a bf16 output are the ones the call uses: none is created by it.
  kernels::gemm_prepare(48, 40, 56, false, true, DType::BF16, 1.0f, 0.0f, DType::BF16);
  const int64_t created = kernels::gemm_stats().primitives_created;
  Tensor a = randn({48, 56}, DType::F32, 5).to(DType::BF16), b = randn({40, 56}, DType::F32, 6).to(DType::BF16);
  Tensor y = Tensor::empty({48, 40}, DType::BF16);
  kernels::gemm(a, false, b, true, y);
  EXPECT_EQ(kernels::gemm_stats().primitives_created, created);
}

TEST(ActivationBf16Input, TheBitsOfTheWidenedInput) {
  for (const auto act : {kernels::Activation::SwiGLU, kernels::Activation::GeLU, kernels::Activation::SquaredReLU}) {
    const int64_t T = 19, F = 40, F1 = kernels::is_gated(act) ? 2 * F : F;
    const Tensor x16 = randn({T, F1}, DType::F32, 11).to(DType::BF16), x32 = x16.to(DType::F32);
    const Tensor p = randn({T}, DType::F32, 12), dy = randn({T, F}, DType::F32, 13);
    for (const Tensor* probs : {static_cast<const Tensor*>(nullptr), &p}) {
      for (const DType out : {DType::F32, DType::BF16}) {
        Tensor ya = Tensor::empty({T, F}, out), yb = Tensor::empty({T, F}, out);
        kernels::activation_forward(act, x16, probs, ya);
        kernels::activation_forward(act, x32, probs, yb);
        EXPECT_TRUE(bitwise_equal(ya, yb)) << kernels::activation_name(act) << " forward";
        Tensor da = Tensor::empty({T, F1}, out), db = Tensor::empty({T, F1}, out);
        Tensor dpa = Tensor::empty({T}, DType::F32), dpb = Tensor::empty({T}, DType::F32);
        kernels::activation_backward(act, dy, x16, probs, da, probs ? &dpa : nullptr);
        kernels::activation_backward(act, dy, x32, probs, db, probs ? &dpb : nullptr);
        EXPECT_TRUE(bitwise_equal(da, db)) << kernels::activation_name(act) << " backward";
        // dprobs is a sum over the row, whose FMA contraction the compiler may choose differently per instantiation.
        if (probs) {
          EXPECT_LT(testing::max_rel_diff(dpa, dpb), 1e-6) << kernels::activation_name(act) << " dprobs";
        }
      }
    }
  }
}

// The expert backward's bf16 output gradient (fc2's data-gradient GEMM writes it rounded) is read as its widened
// values: the bits of the call given those values in f32. A bf16 dy with f32 x or dx is refused.
TEST(ActivationBf16Input, Bf16OutputGradientIsReadWidened) {
  for (const auto act : {kernels::Activation::SwiGLU, kernels::Activation::GeLU, kernels::Activation::SquaredReLU}) {
    const int64_t T = 23, F = 48, F1 = kernels::is_gated(act) ? 2 * F : F;
    const Tensor x = randn({T, F1}, DType::F32, 21).to(DType::BF16);
    const Tensor p = randn({T}, DType::F32, 22), dy16 = randn({T, F}, DType::F32, 23).to(DType::BF16);
    const Tensor dy32 = dy16.to(DType::F32);
    Tensor da = Tensor::empty({T, F1}, DType::BF16), db = Tensor::empty({T, F1}, DType::BF16);
    Tensor dpa = Tensor::empty({T}, DType::F32), dpb = Tensor::empty({T}, DType::F32);
    kernels::activation_backward(act, dy16, x, &p, da, &dpa);
    kernels::activation_backward(act, dy32, x, &p, db, &dpb);
    EXPECT_TRUE(bitwise_equal(da, db)) << kernels::activation_name(act);
    EXPECT_LT(testing::max_rel_diff(dpa, dpb), 1e-6) << kernels::activation_name(act) << " dprobs";
    Tensor d32 = Tensor::empty({T, F1}, DType::F32);
    EXPECT_THROW(kernels::activation_backward(act, dy16, x, &p, d32, nullptr), InternalError);
  }
}

// A Linear given an input its producer already rounded to bf16 gives the bits of one given the f32 input, and
// its stash shares that input instead of copying it; the same for the output gradient; a bf16 output is the f32
// output rounded.
TEST(LinearBf16Input, SameBitsAndNoCopy) {
  nn::ParamRegistry reg(DType::F32);
  nn::LinearConfig cfg;
  cfg.in = 48;
  cfg.out = 40;
  cfg.init = nn::InitRule::normal(0.05);
  cfg.low = DType::BF16;
  nn::Linear lin(reg, "l", cfg);
  reg.initialize(5);
  const Tensor x = randn({17, 48}, DType::F32, 31), dy = randn({17, 40}, DType::F32, 32);
  const Tensor x16 = x.to(DType::BF16), dy16 = dy.to(DType::BF16);
  nn::Linear::Stash sa, sb;
  const Tensor ya = lin.forward(x, sa), yb = lin.forward(x16, sb);
  EXPECT_TRUE(bitwise_equal(ya, yb));
  EXPECT_TRUE(sb.x.shares_storage(x16)) << "the stash copied a bf16 input";
  nn::Linear::Stash sc;
  EXPECT_TRUE(bitwise_equal(lin.forward(x16, sc, DType::BF16), ya.to(DType::BF16)));
  reg.zero_grad();
  const Tensor dxa = lin.backward(dy, sa);
  const Tensor ga = reg.all()[0]->grad.clone();
  reg.zero_grad();
  const Tensor dxb = lin.backward(dy16, sb);
  EXPECT_TRUE(bitwise_equal(dxa, dxb));
  EXPECT_TRUE(bitwise_equal(ga, reg.all()[0]->grad));
}

}  // namespace
}  // namespace moecore
