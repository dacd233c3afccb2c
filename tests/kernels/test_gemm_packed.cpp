// Packed bf16 weights (kernels::PackedWeight): a product with a weight packed once gives the bits of the
// product with the plain weight, for both transposes, f32 and bf16 outputs, beta 0 and 1, row counts other than the
// one the weight was packed for (where oneDNN may want another layout: the plain weight is read then), and a weight
// repacked into the same buffer; where packing does not apply (f32, f64) the plain product runs. Within a
// Bf16WeightScope that packs a parameter's slices are packed once; elsewhere nothing is packed; a step packs from 4
// micro-batches on.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "moecore/kernels/elementwise.h"
#include "moecore/kernels/gemm.h"
#include "moecore/nn/parameter.h"
#include "test_util.h"

namespace moecore {
namespace {

using testing::bitwise_equal;
using testing::randn;

Tensor bf16_randn(const Shape& s, uint64_t seed) {
  return randn(s, DType::F32, seed).to(DType::BF16);
}

int64_t packed_calls() {
  int64_t n = 0;
  for (const kernels::GemmShapeStats& g : kernels::gemm_shape_stats()) n += g.packed_b ? g.calls : 0;
  return n;
}

TEST(GemmPacked, EqualsThePlainProductBitForBit) {
  const int64_t calls_before = packed_calls();
  struct Case {
    int64_t M, N, K;
    bool trans;
  };
  for (const Case c : {Case{256, 128, 96, true}, Case{64, 96, 128, false}, Case{32, 64, 64, true},
                       Case{200, 48, 80, false}, Case{1, 32, 16, true}}) {
    const Tensor W = bf16_randn(c.trans ? Shape{c.N, c.K} : Shape{c.K, c.N}, 2);
    kernels::PackedWeight pw;
    kernels::pack_weight(W, c.trans, 256, pw);
    if (kernels::gemm_stats().bf16_native) {
      EXPECT_TRUE(pw.packed.defined()) << "M=" << c.M;
    }
    for (const int64_t m : {c.M, int64_t{32}}) {
      const Tensor A = bf16_randn({m, c.K}, 3 + m);
      Tensor want = randn({m, c.N}, DType::F32, 5), got = want.clone();
      kernels::gemm(A, false, W, c.trans, want, 1.0f, 1.0f);
      kernels::gemm(A, pw, got, 1.0f);
      EXPECT_TRUE(bitwise_equal(got, want)) << "beta 1, M=" << m << " N=" << c.N << " K=" << c.K;
      Tensor want16 = Tensor::empty({m, c.N}, DType::BF16), got16 = Tensor::empty({m, c.N}, DType::BF16);
      kernels::gemm(A, false, W, c.trans, want16);
      kernels::gemm(A, pw, got16);
      EXPECT_TRUE(bitwise_equal(got16, want16)) << "bf16 out, M=" << m << " N=" << c.N << " K=" << c.K;
    }
  }
  // The packed products ran as packed primitives (at least those of the row count the weights were packed for).
  if (kernels::gemm_stats().bf16_native) {
    EXPECT_GE(packed_calls() - calls_before, 2);
  }
}

TEST(GemmPacked, RepackingIntoTheSameBufferFollowsTheWeight) {
  kernels::PackedWeight pw;
  const Tensor A = bf16_randn({64, 96}, 7);
  for (uint64_t seed : {11, 12}) {
    const Tensor W = bf16_randn({80, 96}, seed);
    kernels::pack_weight(W, true, 64, pw);
    Tensor want = Tensor::empty({64, 80}, DType::F32), got = Tensor::empty({64, 80}, DType::F32);
    kernels::gemm(A, false, W, true, want);
    kernels::gemm(A, pw, got);
    EXPECT_TRUE(bitwise_equal(got, want)) << "seed " << seed;
  }
}

TEST(GemmPacked, NothingPackedOutsideBf16) {
  for (DType dt : {DType::F32, DType::F64}) {
    const Tensor W = randn({24, 40}, dt, 1), A = randn({16, 40}, dt, 2);
    kernels::PackedWeight pw;
    kernels::pack_weight(W, true, 16, pw);
    EXPECT_FALSE(pw.packed.defined());
    Tensor want = Tensor::empty({16, 24}, dt), got = Tensor::empty({16, 24}, dt);
    kernels::gemm(A, false, W, true, want);
    kernels::gemm(A, pw, got);
    EXPECT_TRUE(bitwise_equal(got, want)) << dtype_name(dt);
  }
  EXPECT_EQ(kernels::packed_weight_bytes(40, 24, true, 16) > 0, kernels::gemm_stats().bf16_native);
  EXPECT_FALSE(kernels::pack_weights_for(1));
  EXPECT_EQ(kernels::pack_weights_for(4), kernels::gemm_stats().bf16_native);
}

TEST(GemmPacked, AParametersSlicesArePackedOncePerScope) {
  if (!kernels::gemm_stats().bf16_native) GTEST_SKIP() << "this CPU has no bf16 matmul: nothing is packed";
  nn::ParamRegistry reg;
  nn::Parameter& p = reg.add("w", {2, 32, 48}, nn::InitRule::normal(0.02));
  reg.initialize(1);
  const auto slice = [&](const Tensor& w, int64_t e) { return w.slice(e, 1).reshape({32, 48}); };
  EXPECT_FALSE(nn::packed_bf16_weight(p, slice(nn::low_weights(p, DType::BF16), 0), 0, true, 32).packed.defined())
      << "outside a scope nothing is packed";
  {
    nn::Bf16WeightScope scope(reg);
    EXPECT_FALSE(nn::packed_bf16_weight(p, slice(nn::low_weights(p, DType::BF16), 0), 0, true, 32).packed.defined())
        << "a scope that does not pack";
  }
  {
    nn::Bf16WeightScope scope(reg, true);
    const Tensor w = nn::low_weights(p, DType::BF16);
    const kernels::PackedWeight a = nn::packed_bf16_weight(p, slice(w, 1), 1, true, 32);
    const kernels::PackedWeight b = nn::packed_bf16_weight(p, slice(w, 1), 1, true, 32);
    ASSERT_TRUE(a.packed.defined());
    EXPECT_EQ(a.packed.raw(), b.packed.raw()) << "packed once per scope";
    EXPECT_NE(nn::packed_bf16_weight(p, slice(w, 1), 1, false, 32).packed.raw(), a.packed.raw())
        << "each transpose has its own slot";
  }
  // The next step's weights: the scope repacks them.
  p.value.set_item(0, 3.0);
  nn::Bf16WeightScope scope(reg, true);
  const Tensor w = nn::low_weights(p, DType::BF16);
  const kernels::PackedWeight pw = nn::packed_bf16_weight(p, slice(w, 0), 0, true, 32);
  const Tensor A = bf16_randn({32, 48}, 4);
  Tensor want = Tensor::empty({32, 32}, DType::F32), got = Tensor::empty({32, 32}, DType::F32);
  kernels::gemm(A, false, slice(w, 0), true, want);
  kernels::gemm(A, pw, got);
  EXPECT_TRUE(bitwise_equal(got, want)) << "packed from the weights of this scope";
}

}  // namespace
}  // namespace moecore

namespace moecore {
namespace {

// A product of at least 8,192 rows (the output layer's weight gradient, M = vocabulary) reorders B first into the
// layout oneDNN chooses (gemm_context.h kPackedBRows): the rows equal those of the same product in plain halves of
// 4,096 rows within f32 rounding, a rerun gives the same bits, and on a CPU with bf16 matmul it ran packed.
TEST(GemmPackedB, LargeProductsReorderBAndMatchThePlainHalves) {
  const int64_t M = 8192, N = 48, K = 64;
  for (const bool trans_a : {true, false}) {
    // A_MK row-major; for trans_a the same matrix stored as its transpose [K, M].
    const Tensor A_MK = bf16_randn({M, K}, 11), B = bf16_randn({K, N}, 12);
    Tensor A = A_MK;
    if (trans_a) {
      A = Tensor::empty({K, M}, DType::BF16);
      const bf16* src = A_MK.data<bf16>();
      bf16* dst = A.data<bf16>();
      for (int64_t m = 0; m < M; m++)
        for (int64_t k = 0; k < K; k++) dst[k * M + m] = src[m * K + k];
    }
    const int64_t before = packed_calls();
    Tensor got = randn({M, N}, DType::F32, 13), again = got.clone(), want = got.clone();
    kernels::gemm(A, trans_a, B, false, got, 1.0f, 1.0f);
    kernels::gemm(A, trans_a, B, false, again, 1.0f, 1.0f);
    EXPECT_TRUE(bitwise_equal(got, again)) << "rerun, trans_a " << trans_a;
    if (kernels::gemm_stats().bf16_native) {
      EXPECT_EQ(packed_calls() - before, 2) << "trans_a " << trans_a;
    }
    // The halves through the plain path, from the row-major A.
    for (int64_t r = 0; r < M; r += M / 2) {
      Tensor half = want.slice(r, M / 2);
      kernels::gemm(A_MK.slice(r, M / 2), false, B, false, half, 1.0f, 1.0f);
    }
    double worst = 0;
    for (int64_t i = 0; i < got.numel(); i++) worst = std::max(worst, std::abs(got.item(i) - want.item(i)));
    EXPECT_LT(worst, 1e-4) << "trans_a " << trans_a;
  }
}

}  // namespace
}  // namespace moecore

namespace moecore {
namespace {

// The bf16 copy an AdamW update wrote (Parameter::low_cache_from_update) is what the next Bf16WeightScope reads,
// without rounding the weight again; a weight written by anything else after the update (here a fill, as a
// checkpoint load would) is rounded afresh, and so is every weight in the scope after that.
TEST(Bf16WeightScope, TakesTheOptimizersCopyOnlyWhileItRoundsTheWeight) {
  nn::ParamRegistry reg(DType::F32);
  nn::Parameter& w = reg.add("w", {64, 32}, nn::InitRule::normal(0.02));
  reg.initialize(3);
  {
    const nn::Bf16WeightScope scope(reg);
    EXPECT_TRUE(bitwise_equal(nn::low_weights(w, DType::BF16), w.value.to(DType::BF16)));
  }
  // An update that wrote the copy: the copy holds the new rounding, and the scope takes it as it is.
  for (int64_t i = 0; i < w.value.numel(); i++) w.value.set_item(i, w.value.item(i) * 1.5);
  w.low_cache.copy_from(w.value);
  w.low_cache_from_update = true;
  const void* copy = w.low_cache.raw();
  {
    const nn::Bf16WeightScope scope(reg);
    const Tensor b = nn::low_weights(w, DType::BF16);
    EXPECT_EQ(b.raw(), copy);
    EXPECT_TRUE(bitwise_equal(b, w.value.to(DType::BF16)));
  }
  EXPECT_FALSE(w.low_cache_from_update);  // one scope only
  // The flag set, but the weight changed after the copy was written: rounded afresh.
  w.low_cache_from_update = true;
  kernels::fill_(w.value, 0.25);
  {
    const nn::Bf16WeightScope scope(reg);
    EXPECT_TRUE(bitwise_equal(nn::low_weights(w, DType::BF16), w.value.to(DType::BF16)));
  }
}

}  // namespace
}  // namespace moecore
