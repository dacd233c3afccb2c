// fp64 finite-difference gradient checks of every kernel, and f32-against-f64 agreement. Each check uses the
// scalar loss L = Σ y ⊙ w with a fixed random w, so dL/dy = w is the upstream gradient.
#include <gtest/gtest.h>

#include "moecore/kernels/activation.h"
#include "moecore/kernels/attention.h"
#include "moecore/kernels/cross_entropy.h"
#include "moecore/kernels/elementwise.h"
#include "moecore/kernels/embedding.h"
#include "moecore/kernels/gemm.h"
#include "moecore/kernels/rmsnorm.h"
#include "moecore/kernels/rope.h"
#include "test_util.h"

namespace moecore {
namespace {

using testing::fd_rel_error;
using testing::kGradTol;
using testing::randn;

TEST(KernelGrad, Gemm) {
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      const int64_t M = 5, N = 4, K = 6;
      Tensor A = randn(ta ? Shape{K, M} : Shape{M, K}, DType::F64, 1);
      Tensor B = randn(tb ? Shape{N, K} : Shape{K, N}, DType::F64, 2);
      Tensor W = randn({M, N}, DType::F64, 3);
      auto loss = [&] {
        Tensor C = Tensor::empty({M, N}, DType::F64);
        kernels::gemm(A, ta, B, tb, C);
        return kernels::dot(C, W);
      };
      // dA = W·op(B)ᵀ (transposed back when A is stored transposed); dB likewise.
      Tensor dA = Tensor::empty(A.shape(), DType::F64), dB = Tensor::empty(B.shape(), DType::F64);
      if (!ta)
        kernels::gemm(W, false, B, !tb, dA);
      else
        kernels::gemm(B, tb, W, true, dA);
      if (!tb)
        kernels::gemm(A, !ta, W, false, dB);
      else
        kernels::gemm(W, true, A, ta, dB);
      EXPECT_LT(fd_rel_error(loss, A, dA), kGradTol);
      EXPECT_LT(fd_rel_error(loss, B, dB), kGradTol);
    }
}

TEST(KernelGrad, RMSNorm) {
  const int64_t T = 6, H = 10;
  Tensor x = randn({T, H}, DType::F64, 1), w = randn({H}, DType::F64, 2), W = randn({T, H}, DType::F64, 3);
  auto loss = [&] {
    Tensor y = Tensor::empty({T, H}, DType::F64), r = Tensor::empty({T}, DType::F64);
    kernels::rmsnorm_forward(x, w, 1e-5, y, r);
    return kernels::dot(y, W);
  };
  Tensor y = Tensor::empty({T, H}, DType::F64), r = Tensor::empty({T}, DType::F64);
  kernels::rmsnorm_forward(x, w, 1e-5, y, r);
  Tensor dx = Tensor::empty({T, H}, DType::F64), dw = Tensor::zeros({H}, DType::F64);
  kernels::rmsnorm_backward(W, x, w, r, dx, dw);
  EXPECT_LT(fd_rel_error(loss, x, dx), kGradTol);
  EXPECT_LT(fd_rel_error(loss, w, dw), kGradTol);
  // Backward accumulates into dw.
  Tensor dw2 = dw.clone();
  kernels::rmsnorm_backward(W, x, w, r, dx, dw2);
  kernels::scale_(dw, 2.0);
  EXPECT_LT(testing::max_rel_diff(dw2, dw), 1e-14);
}

// Rows whose f32 sum of squares overflows (a diverged run's activations) still normalize to the f64 result.
TEST(Kernel, RMSNormHugeRowsStayFinite) {
  const int64_t H = 8;
  const double rows[3][8] = {{1e30, -2e30, 3e30, 0, 5e29, -1e30, 1e30, 2e30},
                             {3e38, -3e38, 1e38, 2e38, -1e38, 3e38, 0, 1},
                             {1e-3, 2e-3, -1e-3, 0, 4e-3, 1e-3, -2e-3, 3e-3}};  // the ordinary path, unchanged
  Tensor x = Tensor::empty({3, H}, DType::F32), w = Tensor::empty({H}, DType::F32);
  for (int64_t j = 0; j < H; j++) w.set_item(j, 0.5 + 0.1 * static_cast<double>(j));
  for (int64_t t = 0; t < 3; t++)
    for (int64_t j = 0; j < H; j++) x.set_item(t * H + j, rows[t][j]);
  Tensor y = Tensor::empty({3, H}, DType::F32), r = Tensor::empty({3}, DType::F32);
  kernels::rmsnorm_forward(x, w, 1e-5, y, r);
  for (int64_t t = 0; t < 3; t++) {
    double ss = 0;  // f64 reference from the f32 inputs
    for (int64_t j = 0; j < H; j++) ss += x.item(t * H + j) * x.item(t * H + j);
    const double rstd = 1.0 / std::sqrt(ss / H + 1e-5);
    for (int64_t j = 0; j < H; j++) {
      const double ref = x.item(t * H + j) * rstd * w.item(j);
      ASSERT_TRUE(std::isfinite(y.item(t * H + j))) << "row " << t;
      EXPECT_NEAR(y.item(t * H + j), ref, 1e-5 * (1 + std::fabs(ref))) << "row " << t << " column " << j;
    }
  }
}

TEST(KernelGrad, RoPE) {
  for (double frac : {1.0, 0.5}) {
    const int64_t S = 5, B = 2, N = 3, D = 8, rot = static_cast<int64_t>(D * frac);
    Tensor x = randn({S, B, N, D}, DType::F64, 1), W = randn({S, B, N, D}, DType::F64, 2);
    Tensor c, s;
    kernels::rope_tables(S, rot, 10000.0, DType::F64, c, s);
    auto loss = [&] {
      Tensor y = Tensor::empty(x.shape(), DType::F64);
      kernels::rope_forward(x, c, s, rot, y);
      return kernels::dot(y, W);
    };
    Tensor dx = Tensor::empty(x.shape(), DType::F64);
    kernels::rope_backward(W, c, s, rot, dx);
    EXPECT_LT(fd_rel_error(loss, x, dx), kGradTol);
  }
}

TEST(Kernel, RoPEHandComputed) {
  // Position 1, one pair with inv_freq 1 (i = 0): (x0, x1) rotates by 1 radian; the unrotated channel passes.
  const int64_t rot = 2;
  Tensor c, s;
  kernels::rope_tables(2, rot, 10000.0, DType::F64, c, s);
  Tensor x = Tensor::empty({2, 1, 1, 3}, DType::F64);
  for (int i = 0; i < 6; i++) x.set_item(i, i + 1);  // pos 0: (1,2,3), pos 1: (4,5,6)
  Tensor y = Tensor::empty(x.shape(), DType::F64);
  kernels::rope_forward(x, c, s, rot, y);
  EXPECT_DOUBLE_EQ(y.item(0), 1);
  EXPECT_DOUBLE_EQ(y.item(1), 2);
  EXPECT_NEAR(y.item(3), 4 * std::cos(1.0) - 5 * std::sin(1.0), 1e-15);
  EXPECT_NEAR(y.item(4), 5 * std::cos(1.0) + 4 * std::sin(1.0), 1e-15);
  EXPECT_DOUBLE_EQ(y.item(5), 6);
}

TEST(KernelGrad, Activations) {
  for (kernels::Activation act :
       {kernels::Activation::SwiGLU, kernels::Activation::GeLU, kernels::Activation::SquaredReLU})
    for (bool with_probs : {false, true}) {
      const int64_t T = 5, F = 7, X = kernels::is_gated(act) ? 2 * F : F;
      Tensor x = randn({T, X}, DType::F64, 1), p = randn({T}, DType::F64, 2), W = randn({T, F}, DType::F64, 3);
      const Tensor* pp = with_probs ? &p : nullptr;
      auto loss = [&] {
        Tensor y = Tensor::empty({T, F}, DType::F64);
        kernels::activation_forward(act, x, pp, y);
        return kernels::dot(y, W);
      };
      Tensor dx = Tensor::empty(x.shape(), DType::F64), dp = Tensor::empty({T}, DType::F64);
      kernels::activation_backward(act, W, x, pp, dx, with_probs ? &dp : nullptr);
      EXPECT_LT(fd_rel_error(loss, x, dx), kGradTol) << kernels::activation_name(act);
      if (with_probs) {
        EXPECT_LT(fd_rel_error(loss, p, dp), kGradTol) << kernels::activation_name(act);
      }
    }
}

TEST(Kernel, ActivationValues) {
  Tensor x = Tensor::empty({1, 2}, DType::F64);
  x.set_item(0, 1.0);
  x.set_item(1, 3.0);
  Tensor y = Tensor::empty({1, 1}, DType::F64);
  kernels::activation_forward(kernels::Activation::SwiGLU, x, nullptr, y);
  EXPECT_NEAR(y.item(0), 1.0 / (1.0 + std::exp(-1.0)) * 3.0, 1e-15);  // silu(1)·3
  Tensor g = Tensor::empty({1, 1}, DType::F64), gy = Tensor::empty({1, 1}, DType::F64);
  g.set_item(0, 1.0);
  kernels::activation_forward(kernels::Activation::GeLU, g, nullptr, gy);
  EXPECT_NEAR(gy.item(0), 0.8413447460685429, 1e-15);  // Φ(1)
  g.set_item(0, -2.0);
  kernels::activation_forward(kernels::Activation::SquaredReLU, g, nullptr, gy);
  EXPECT_EQ(gy.item(0), 0.0);
  EXPECT_THROW(kernels::parse_activation("relu6"), Error);
}

TEST(KernelGrad, Embedding) {
  const int64_t V = 7, H = 5, T = 9;
  Tensor w = randn({V, H}, DType::F64, 1), W = randn({T, H}, DType::F64, 2);
  Tensor ids = testing::randint({T}, V, 3);
  ids.data<int64_t>()[1] = ids.data<int64_t>()[4];  // a repeated id
  auto loss = [&] {
    Tensor y = Tensor::empty({T, H}, DType::F64);
    kernels::embedding_forward(ids, w, y);
    return kernels::dot(y, W);
  };
  Tensor dw = Tensor::zeros({V, H}, DType::F64);
  kernels::embedding_backward(W, ids, dw);
  EXPECT_LT(fd_rel_error(loss, w, dw), kGradTol);
  ids.data<int64_t>()[2] = V;  // out of range: a user error naming the id
  Tensor y = Tensor::empty({T, H}, DType::F64);
  EXPECT_THROW(kernels::embedding_forward(ids, w, y), Error);
}

TEST(KernelGrad, CrossEntropy) {
  const int64_t T = 6, V = 11;
  Tensor logits = randn({T, V}, DType::F64, 1, 3.0), g = randn({T}, DType::F64, 2);
  Tensor tgt = testing::randint({T}, V, 3);
  auto loss = [&] {
    Tensor l = Tensor::empty({T}, DType::F64), lse = Tensor::empty({T}, DType::F64);
    kernels::cross_entropy_forward(logits, tgt, l, lse);
    return kernels::dot(l, g);
  };
  Tensor l = Tensor::empty({T}, DType::F64), lse = Tensor::empty({T}, DType::F64);
  kernels::cross_entropy_forward(logits, tgt, l, lse);
  Tensor d = Tensor::empty({T, V}, DType::F64);
  kernels::cross_entropy_backward(g, logits, tgt, lse, d);
  EXPECT_LT(fd_rel_error(loss, logits, d), kGradTol);
  // Hand value: uniform logits give log V.
  Tensor z = Tensor::zeros({1, V}, DType::F64), t0 = Tensor::zeros({1}, DType::I64);
  Tensor l1 = Tensor::empty({1}, DType::F64), s1 = Tensor::empty({1}, DType::F64);
  kernels::cross_entropy_forward(z, t0, l1, s1);
  EXPECT_NEAR(l1.item(0), std::log(static_cast<double>(V)), 1e-15);
  // Large logits stay finite (max subtraction).
  z.set_item(3, 1000.0);
  kernels::cross_entropy_forward(z, t0, l1, s1);
  EXPECT_NEAR(l1.item(0), 1000.0, 1e-9);
}

struct AttnCase {
  int64_t S, B, Nq, Nkv, D;
};

// Materialized-softmax causal attention, the textbook definition.
Tensor naive_attention(const Tensor& q, const Tensor& k, const Tensor& v, double scale) {
  const int64_t S = q.dim(0), B = q.dim(1), Nq = q.dim(2), Nkv = k.dim(2), D = q.dim(3);
  Tensor o = Tensor::zeros(q.shape(), DType::F64);
  auto at = [](const Tensor& t, int64_t s, int64_t b, int64_t n, int64_t d) {
    return t.item(((s * t.dim(1) + b) * t.dim(2) + n) * t.dim(3) + d);
  };
  for (int64_t b = 0; b < B; b++)
    for (int64_t h = 0; h < Nq; h++) {
      const int64_t g = h / (Nq / Nkv);
      for (int64_t i = 0; i < S; i++) {
        std::vector<double> p(i + 1);
        double mx = -1e300, sum = 0;
        for (int64_t j = 0; j <= i; j++) {
          double s = 0;
          for (int64_t d = 0; d < D; d++) s += at(q, i, b, h, d) * at(k, j, b, g, d);
          p[j] = s * scale;
          mx = std::max(mx, p[j]);
        }
        for (auto& x : p) sum += (x = std::exp(x - mx));
        for (int64_t d = 0; d < D; d++) {
          double acc = 0;
          for (int64_t j = 0; j <= i; j++) acc += p[j] / sum * at(v, j, b, g, d);
          o.set_item(((i * B + b) * Nq + h) * D + d, acc);
        }
      }
    }
  return o;
}

TEST(KernelGrad, AttentionMatchesNaiveAndFiniteDifferences) {
  // S=70 crosses a tile boundary (64) with a ragged last tile; GQA with 2 query heads per kv head.
  for (AttnCase c : {AttnCase{5, 2, 2, 2, 4}, AttnCase{70, 2, 4, 2, 4}, AttnCase{130, 1, 3, 1, 3}}) {
    Tensor q = randn({c.S, c.B, c.Nq, c.D}, DType::F64, 1), k = randn({c.S, c.B, c.Nkv, c.D}, DType::F64, 2);
    Tensor v = randn({c.S, c.B, c.Nkv, c.D}, DType::F64, 3), W = randn(q.shape(), DType::F64, 4);
    const double scale = 1.0 / std::sqrt(static_cast<double>(c.D));
    Tensor o = Tensor::empty(q.shape(), DType::F64), lse = Tensor::empty({c.B, c.Nq, c.S}, DType::F64);
    kernels::attention_forward(q, k, v, scale, o, lse);
    EXPECT_LT(testing::max_rel_diff(o, naive_attention(q, k, v, scale)), 1e-12);
    auto loss = [&] {
      Tensor o2 = Tensor::empty(q.shape(), DType::F64), l2 = Tensor::empty({c.B, c.Nq, c.S}, DType::F64);
      kernels::attention_forward(q, k, v, scale, o2, l2);
      return kernels::dot(o2, W);
    };
    Tensor dq = Tensor::empty(q.shape(), DType::F64), dk = Tensor::empty(k.shape(), DType::F64),
           dv = Tensor::empty(v.shape(), DType::F64);
    kernels::attention_backward(W, q, k, v, o, lse, scale, dq, dk, dv);
    EXPECT_LT(fd_rel_error(loss, q, dq, 150), kGradTol) << "S=" << c.S;
    EXPECT_LT(fd_rel_error(loss, k, dk, 150), kGradTol) << "S=" << c.S;
    EXPECT_LT(fd_rel_error(loss, v, dv, 150), kGradTol) << "S=" << c.S;
  }
}

// The f32 kernels agree with the f64 ones to f32 rounding.
TEST(Kernel, F32AgreesWithF64) {
  const int64_t S = 100, B = 2, Nq = 4, Nkv = 2, D = 16;
  Tensor q = randn({S, B, Nq, D}, DType::F64, 1), k = randn({S, B, Nkv, D}, DType::F64, 2);
  Tensor v = randn({S, B, Nkv, D}, DType::F64, 3), g = randn(q.shape(), DType::F64, 4);
  auto run = [&](DType dt, Tensor& o, Tensor& dq, Tensor& dk, Tensor& dv) {
    Tensor q_ = q.to(dt), k_ = k.to(dt), v_ = v.to(dt), g_ = g.to(dt);
    o = Tensor::empty(q.shape(), dt);
    Tensor lse = Tensor::empty({B, Nq, S}, dt);
    kernels::attention_forward(q_, k_, v_, 0.25, o, lse);
    dq = Tensor::empty(q.shape(), dt);
    dk = Tensor::empty(k.shape(), dt);
    dv = Tensor::empty(v.shape(), dt);
    kernels::attention_backward(g_, q_, k_, v_, o, lse, 0.25, dq, dk, dv);
  };
  Tensor o64, dq64, dk64, dv64, o32, dq32, dk32, dv32;
  run(DType::F64, o64, dq64, dk64, dv64);
  run(DType::F32, o32, dq32, dk32, dv32);
  EXPECT_LT(testing::max_rel_diff(o32, o64), 1e-5);
  EXPECT_LT(testing::max_rel_diff(dq32, dq64), 1e-5);
  EXPECT_LT(testing::max_rel_diff(dk32, dk64), 1e-5);
  EXPECT_LT(testing::max_rel_diff(dv32, dv64), 1e-5);

  const int64_t T = 50, H = 64, V = 300;
  Tensor x = randn({T, H}, DType::F64, 5), w = randn({H}, DType::F64, 6);
  Tensor y64 = Tensor::empty({T, H}, DType::F64), r64 = Tensor::empty({T}, DType::F64);
  Tensor y32 = Tensor::empty({T, H}, DType::F32), r32 = Tensor::empty({T}, DType::F32);
  kernels::rmsnorm_forward(x, w, 1e-5, y64, r64);
  kernels::rmsnorm_forward(x.to(DType::F32), w.to(DType::F32), 1e-5, y32, r32);
  EXPECT_LT(testing::max_rel_diff(y32, y64), 1e-6);
  Tensor lg = randn({T, V}, DType::F64, 7, 4.0);
  Tensor tg = testing::randint({T}, V, 8);
  Tensor l64 = Tensor::empty({T}, DType::F64), s64 = Tensor::empty({T}, DType::F64);
  Tensor l32 = Tensor::empty({T}, DType::F32), s32 = Tensor::empty({T}, DType::F32);
  kernels::cross_entropy_forward(lg, tg, l64, s64);
  kernels::cross_entropy_forward(lg.to(DType::F32), tg, l32, s32);
  EXPECT_LT(testing::max_rel_diff(l32, l64), 1e-5);
  for (kernels::Activation act :
       {kernels::Activation::SwiGLU, kernels::Activation::GeLU, kernels::Activation::SquaredReLU}) {
    const int64_t X = kernels::is_gated(act) ? 2 * H : H;
    Tensor a = randn({T, X}, DType::F64, 9);
    Tensor o_64 = Tensor::empty({T, H}, DType::F64), o_32 = Tensor::empty({T, H}, DType::F32);
    kernels::activation_forward(act, a, nullptr, o_64);
    kernels::activation_forward(act, a.to(DType::F32), nullptr, o_32);
    EXPECT_LT(testing::max_rel_diff(o_32, o_64), 1e-6) << kernels::activation_name(act);
  }
}

TEST(Kernel, AttentionIsDeterministic) {
  const int64_t S = 150, B = 2, Nq = 4, Nkv = 2, D = 8;
  Tensor q = randn({S, B, Nq, D}, DType::F32, 1), k = randn({S, B, Nkv, D}, DType::F32, 2);
  Tensor v = randn({S, B, Nkv, D}, DType::F32, 3), g = randn(q.shape(), DType::F32, 4);
  Tensor dk[2];
  for (int r = 0; r < 2; r++) {
    Tensor o = Tensor::empty(q.shape(), DType::F32), lse = Tensor::empty({B, Nq, S}, DType::F32);
    kernels::attention_forward(q, k, v, 0.3, o, lse);
    Tensor dq = Tensor::empty(q.shape(), DType::F32), dv = Tensor::empty(v.shape(), DType::F32);
    dk[r] = Tensor::empty(k.shape(), DType::F32);
    kernels::attention_backward(g, q, k, v, o, lse, 0.3, dq, dk[r], dv);
  }
  EXPECT_TRUE(testing::bitwise_equal(dk[0], dk[1]));
}

// The bf16-GEMM attention (--bf16 training) against the exact f64 kernel: outputs and gradients within bf16
// rounding (operands carry 8 significant bits; errors are relative to the largest element). Cases cross query
// blocks with a ragged last block (S=301) and split one kv head's query group across head chunks (S=2048, 8 query
// heads on one kv head).
TEST(Kernel, Bf16AttentionWithinBf16Rounding) {
  for (AttnCase c :
       {AttnCase{5, 2, 2, 2, 4}, AttnCase{70, 2, 4, 2, 16}, AttnCase{301, 1, 3, 1, 8}, AttnCase{2048, 1, 8, 1, 8}}) {
    Tensor q = randn({c.S, c.B, c.Nq, c.D}, DType::F64, 1), k = randn({c.S, c.B, c.Nkv, c.D}, DType::F64, 2);
    Tensor v = randn({c.S, c.B, c.Nkv, c.D}, DType::F64, 3), g = randn(q.shape(), DType::F64, 4);
    const double scale = 1.0 / std::sqrt(static_cast<double>(c.D));
    Tensor o = Tensor::empty(q.shape(), DType::F64), lse = Tensor::empty({c.B, c.Nq, c.S}, DType::F64);
    Tensor dq = Tensor::empty(q.shape(), DType::F64), dk = Tensor::empty(k.shape(), DType::F64),
           dv = Tensor::empty(v.shape(), DType::F64);
    kernels::attention_forward(q, k, v, scale, o, lse);
    kernels::attention_backward(g, q, k, v, o, lse, scale, dq, dk, dv);
    Tensor q32 = q.to(DType::F32), k32 = k.to(DType::F32), v32 = v.to(DType::F32), g32 = g.to(DType::F32);
    Tensor o2 = Tensor::empty(q.shape(), DType::F32), lse2 = Tensor::empty({c.B, c.Nq, c.S}, DType::F32);
    Tensor dq2 = Tensor::empty(q.shape(), DType::F32), dk2 = Tensor::empty(k.shape(), DType::F32),
           dv2 = Tensor::empty(v.shape(), DType::F32);
    kernels::attention_forward_bf16(q32, k32, v32, scale, o2, lse2);
    kernels::attention_backward_bf16(g32, q32, k32, v32, o2, lse2, scale, dq2, dk2, dv2);
    EXPECT_LT(testing::max_rel_diff(o2, o), 1e-2) << "S=" << c.S;
    EXPECT_LT(testing::max_rel_diff(lse2, lse), 1e-2) << "S=" << c.S;
    EXPECT_LT(testing::max_rel_diff(dq2, dq), 2e-2) << "S=" << c.S;
    EXPECT_LT(testing::max_rel_diff(dk2, dk), 2e-2) << "S=" << c.S;
    EXPECT_LT(testing::max_rel_diff(dv2, dv), 2e-2) << "S=" << c.S;
    // A rerun is bitwise identical (fixed reduction order over heads and blocks).
    Tensor dk3 = Tensor::empty(k.shape(), DType::F32);
    kernels::attention_backward_bf16(g32, q32, k32, v32, o2, lse2, scale, dq2, dk3, dv2);
    EXPECT_TRUE(testing::bitwise_equal(dk2, dk3)) << "S=" << c.S;
  }
}

}  // namespace
}  // namespace moecore

#include "moecore/kernels/cpu/vec_math.h"

namespace moecore {
namespace {

TEST(VecMath, ExpAccuracy) {
  double worst32 = 0, worst64 = 0;
  for (double x = -80; x <= 80; x += 0.0137) {
    const double ref = std::exp(x);
    worst32 = std::max(worst32, std::fabs(kernels::vexp(static_cast<float>(x)) -
                                          std::exp(static_cast<double>(static_cast<float>(x)))) /
                                    std::exp(static_cast<double>(static_cast<float>(x))));
    worst64 = std::max(worst64, std::fabs(kernels::vexp(x) - ref) / ref);
  }
  EXPECT_LT(worst32, 3e-7);
  EXPECT_LT(worst64, 5e-16);
  EXPECT_LT(kernels::vexp(-std::numeric_limits<float>::infinity()), 1e-37f);
  EXPECT_LT(kernels::vexp(-std::numeric_limits<double>::infinity()), 1e-300);
  EXPECT_EQ(kernels::vexp(0.0f), 1.0f);
  EXPECT_EQ(kernels::vexp(0.0), 1.0);
}

}  // namespace
}  // namespace moecore
