// The flash attention kernel's block paths (kernels/cpu/attention_flash.cpp, attention_blocks.h): head sizes that
// use every register block and the scalar column tail, ragged tiles, both backward schedules (fused and two-pass:
// identical bits), and both bf16 kernels (flash with bf16 operands, oneDNN) within bf16 rounding of f64.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <vector>

#include "moecore/kernels/attention.h"
#include "moecore/kernels/cpu/attention_flash.h"
#include "moecore/kernels/elementwise.h"
#include "test_util.h"

namespace moecore {
namespace {

using testing::randn;

struct Dims {
  int64_t S, B, Nq, Nkv, D;
};

struct Grads {
  Tensor o, lse, dq, dk, dv;
};

Grads run_f(const Dims& c, DType dt, const kernels::AttentionDropout* drop, uint64_t seed = 1) {
  Tensor q = randn({c.S, c.B, c.Nq, c.D}, DType::F64, seed).to(dt);
  Tensor k = randn({c.S, c.B, c.Nkv, c.D}, DType::F64, seed + 1).to(dt);
  Tensor v = randn({c.S, c.B, c.Nkv, c.D}, DType::F64, seed + 2).to(dt);
  Tensor g = randn(q.shape(), DType::F64, seed + 3).to(dt);
  Grads r{Tensor::empty(q.shape(), dt), Tensor::empty({c.B, c.Nq, c.S}, dt), Tensor::empty(q.shape(), dt),
          Tensor::empty(k.shape(), dt), Tensor::empty(v.shape(), dt)};
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.D));
  kernels::attention_forward(q, k, v, scale, r.o, r.lse, drop);
  kernels::attention_backward(g, q, k, v, r.o, r.lse, scale, r.dq, r.dk, r.dv, drop);
  return r;
}

kernels::AttentionDropout make_dropout(const std::vector<int64_t>& samples, double p) {
  kernels::AttentionDropout d;
  d.mask = kernels::DropoutMask::make(91, 5, p);
  d.sample_B = samples.data();
  d.head_offset = 1;
  return d;
}

// fp64 finite differences at head sizes 12 (f64: two register vectors and one; f32: one vector and a scalar
// tail) and 40, over ragged tiles (S=67, 130), GQA, with and without dropout.
TEST(FlashAttentionGrad, BlockPathsMatchFiniteDifferences) {
  const std::vector<int64_t> samples = {3, 8};
  for (Dims c : {Dims{67, 1, 2, 1, 12}, Dims{130, 2, 2, 1, 40}})
    for (bool with_drop : {false, true}) {
      const kernels::AttentionDropout d = make_dropout(samples, 0.25);
      const kernels::AttentionDropout* drop = with_drop ? &d : nullptr;
      Tensor q = randn({c.S, c.B, c.Nq, c.D}, DType::F64, 11), k = randn({c.S, c.B, c.Nkv, c.D}, DType::F64, 12);
      Tensor v = randn({c.S, c.B, c.Nkv, c.D}, DType::F64, 13), W = randn(q.shape(), DType::F64, 14);
      const double scale = 1.0 / std::sqrt(static_cast<double>(c.D));
      Tensor o = Tensor::empty(q.shape(), DType::F64), lse = Tensor::empty({c.B, c.Nq, c.S}, DType::F64);
      kernels::attention_forward(q, k, v, scale, o, lse, drop);
      auto loss = [&] {
        Tensor o2 = Tensor::empty(q.shape(), DType::F64), l2 = Tensor::empty({c.B, c.Nq, c.S}, DType::F64);
        kernels::attention_forward(q, k, v, scale, o2, l2, drop);
        return kernels::dot(o2, W);
      };
      Tensor dq = Tensor::empty(q.shape(), DType::F64), dk = Tensor::empty(k.shape(), DType::F64),
             dv = Tensor::empty(v.shape(), DType::F64);
      kernels::attention_backward(W, q, k, v, o, lse, scale, dq, dk, dv, drop);
      EXPECT_LT(testing::fd_rel_error(loss, q, dq, 60), testing::kGradTol) << "S=" << c.S << " drop=" << with_drop;
      EXPECT_LT(testing::fd_rel_error(loss, k, dk, 60), testing::kGradTol) << "S=" << c.S << " drop=" << with_drop;
      EXPECT_LT(testing::fd_rel_error(loss, v, dv, 60), testing::kGradTol) << "S=" << c.S << " drop=" << with_drop;
    }
}

// f32 at the production head size (64: six-row blocks of two vectors) against f64, three tiles with a ragged last.
TEST(FlashAttention, F32HeadDim64AgreesWithF64) {
  const Dims c{150, 2, 4, 2, 64};
  const Grads a = run_f(c, DType::F64, nullptr), b = run_f(c, DType::F32, nullptr);
  EXPECT_LT(testing::max_rel_diff(b.o, a.o), 1e-5);
  EXPECT_LT(testing::max_rel_diff(b.lse, a.lse), 1e-5);
  EXPECT_LT(testing::max_rel_diff(b.dq, a.dq), 1e-5);
  EXPECT_LT(testing::max_rel_diff(b.dk, a.dk), 1e-5);
  EXPECT_LT(testing::max_rel_diff(b.dv, a.dv), 1e-5);
}

// One kv head on two threads runs the two-pass backward, one thread the fused one: the same bits.
TEST(FlashAttention, FusedAndTwoPassBackwardGiveIdenticalBits) {
  const std::vector<int64_t> samples = {2};
  const kernels::AttentionDropout d = make_dropout(samples, 0.1);
  const Dims c{200, 1, 3, 1, 16};
  const int before = omp_get_max_threads();
  omp_set_num_threads(1);
  const Grads one = run_f(c, DType::F32, &d);
  omp_set_num_threads(2);
  const Grads two = run_f(c, DType::F32, &d);
  omp_set_num_threads(before);
  EXPECT_TRUE(testing::bitwise_equal(one.o, two.o));
  EXPECT_TRUE(testing::bitwise_equal(one.dq, two.dq));
  EXPECT_TRUE(testing::bitwise_equal(one.dk, two.dk));
  EXPECT_TRUE(testing::bitwise_equal(one.dv, two.dv));
}

// Both bf16 kernels, whichever this CPU trains with, against f64 within bf16 rounding, with dropout; reruns are
// bitwise identical.
TEST(FlashAttention, BothBf16KernelsWithinBf16Rounding) {
  const std::vector<int64_t> samples = {4, 9};
  const kernels::AttentionDropout d = make_dropout(samples, 0.2);
  const Dims c{150, 2, 4, 2, 64};
  const Grads ref = run_f(c, DType::F64, &d);
  Tensor q = randn({c.S, c.B, c.Nq, c.D}, DType::F64, 1).to(DType::F32);
  Tensor k = randn({c.S, c.B, c.Nkv, c.D}, DType::F64, 2).to(DType::F32);
  Tensor v = randn({c.S, c.B, c.Nkv, c.D}, DType::F64, 3).to(DType::F32);
  Tensor g = randn(q.shape(), DType::F64, 4).to(DType::F32);
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.D));
  for (bool onednn : {false, true}) {
    Grads r[2];
    for (Grads& x : r) {
      x = Grads{Tensor::empty(q.shape(), DType::F32), Tensor::empty({c.B, c.Nq, c.S}, DType::F32),
                Tensor::empty(q.shape(), DType::F32), Tensor::empty(k.shape(), DType::F32),
                Tensor::empty(v.shape(), DType::F32)};
      if (onednn) {
        kernels::attention_forward_bf16_onednn(q, k, v, scale, x.o, x.lse, &d);
        kernels::attention_backward_bf16_onednn(g, q, k, v, x.o, x.lse, scale, x.dq, x.dk, x.dv, &d);
      } else {
        kernels::flash::forward(q, k, v, scale, x.o, x.lse, &d, true);
        kernels::flash::backward(g, q, k, v, x.o, x.lse, scale, x.dq, x.dk, x.dv, &d, true);
      }
    }
    EXPECT_LT(testing::max_rel_diff(r[0].o, ref.o), 1e-2) << "onednn=" << onednn;
    EXPECT_LT(testing::max_rel_diff(r[0].lse, ref.lse), 1e-2) << "onednn=" << onednn;
    EXPECT_LT(testing::max_rel_diff(r[0].dq, ref.dq), 2e-2) << "onednn=" << onednn;
    EXPECT_LT(testing::max_rel_diff(r[0].dk, ref.dk), 2e-2) << "onednn=" << onednn;
    EXPECT_LT(testing::max_rel_diff(r[0].dv, ref.dv), 2e-2) << "onednn=" << onednn;
    EXPECT_GT(testing::max_rel_diff(r[0].o, ref.o), 1e-6) << "onednn=" << onednn << ": no bf16 rounding at all?";
    EXPECT_TRUE(testing::bitwise_equal(r[0].dk, r[1].dk)) << "onednn=" << onednn;
    EXPECT_TRUE(testing::bitwise_equal(r[0].dq, r[1].dq)) << "onednn=" << onednn;
  }
}

}  // namespace
}  // namespace moecore
