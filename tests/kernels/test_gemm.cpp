// GEMM: oneDNN f32/bf16 against the f64 loop for every transpose and alpha/beta, the primitive cache, and edge
// shapes.
#include <gtest/gtest.h>
#include <malloc.h>
#include <sys/resource.h>

#include "moecore/kernels/gemm.h"
#include "test_util.h"

namespace moecore {
namespace {

using testing::randn;

// Reference C = alpha·op(A)·op(B) + beta·C0 in f64.
Tensor gemm_reference(const Tensor& A, bool ta, const Tensor& B, bool tb, const Tensor& C0, double alpha, double beta) {
  Tensor a = A.to(DType::F64), b = B.to(DType::F64), c = C0.to(DType::F64);
  kernels::gemm(a, ta, b, tb, c, static_cast<float>(alpha), static_cast<float>(beta));
  return c;
}

TEST(Gemm, F64LoopMatchesHandComputed) {
  Tensor a = Tensor::empty({2, 3}, DType::F64), b = Tensor::empty({3, 2}, DType::F64);
  for (int i = 0; i < 6; i++) {
    a.set_item(i, i + 1);  // [[1,2,3],[4,5,6]]
    b.set_item(i, i + 7);  // [[7,8],[9,10],[11,12]]
  }
  Tensor c = Tensor::zeros({2, 2}, DType::F64);
  kernels::gemm(a, false, b, false, c);
  EXPECT_EQ(c.item(0), 58);
  EXPECT_EQ(c.item(1), 64);
  EXPECT_EQ(c.item(2), 139);
  EXPECT_EQ(c.item(3), 154);
  Tensor ct = Tensor::zeros({3, 3}, DType::F64);  // Aᵀ·Bᵀ: [3,2]·[2,3]
  kernels::gemm(a, true, b, true, ct);
  EXPECT_EQ(ct.item(0), 1 * 7 + 4 * 8);
}

struct GemmCase {
  int64_t M, N, K;
};

TEST(Gemm, F32MatchesF64AllTransposes) {
  for (GemmCase s : {GemmCase{7, 5, 3}, GemmCase{64, 33, 17}, GemmCase{1, 300, 64}, GemmCase{130, 1, 9}})
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        for (auto [alpha, beta] : {std::pair{1.0, 0.0}, std::pair{0.5, 1.0}, std::pair{-2.0, 0.25}}) {
          Tensor A = randn(ta ? Shape{s.K, s.M} : Shape{s.M, s.K}, DType::F32, 1);
          Tensor B = randn(tb ? Shape{s.N, s.K} : Shape{s.K, s.N}, DType::F32, 2);
          Tensor C = randn({s.M, s.N}, DType::F32, 3);
          Tensor ref = gemm_reference(A, ta, B, tb, C, alpha, beta);
          kernels::gemm(A, ta, B, tb, C, static_cast<float>(alpha), static_cast<float>(beta));
          EXPECT_LT(testing::max_rel_diff(C, ref), 1e-5) << s.M << "x" << s.N << "x" << s.K << " ta=" << ta
                                                         << " tb=" << tb << " alpha=" << alpha << " beta=" << beta;
        }
}

// bf16 operands carry 8 significant bits: each product is off by up to ~2^-8 relative, and errors of K random
// terms grow like sqrt(K). Tolerance: 3·2^-8·sqrt(K)/sqrt(K) relative to the output scale, i.e. 1.5% of max |C|.
TEST(Gemm, Bf16WithinStatedTolerance) {
  const int64_t M = 96, N = 80, K = 256;
  Tensor A = randn({M, K}, DType::F32, 4), B = randn({N, K}, DType::F32, 5);
  Tensor C = Tensor::zeros({M, N}, DType::F32);
  Tensor ref = gemm_reference(A, false, B, true, C, 1.0, 0.0);
  kernels::gemm(A.to(DType::BF16), false, B.to(DType::BF16), true, C);
  EXPECT_LT(testing::max_rel_diff(C, ref), 0.015);
  // With operands that are exactly representable in bf16, the result equals the f64 reference to f32 rounding.
  Tensor Ab = A.to(DType::BF16), Bb = B.to(DType::BF16);
  Tensor ref2 = gemm_reference(Ab.to(DType::F32), false, Bb.to(DType::F32), true, C, 1.0, 0.0);
  kernels::gemm(Ab, false, Bb, true, C);
  EXPECT_LT(testing::max_rel_diff(C, ref2), 1e-5);
}

TEST(Gemm, PrimitivesAreCreatedOncePerShape) {
  Tensor A = randn({40, 24}, DType::F32, 6), B = randn({24, 56}, DType::F32, 7);
  Tensor C = Tensor::empty({40, 56}, DType::F32);
  kernels::gemm(A, false, B, false, C);
  const int64_t created = kernels::gemm_stats().primitives_created;
  for (int i = 0; i < 5; i++) kernels::gemm(A, false, B, false, C);
  EXPECT_EQ(kernels::gemm_stats().primitives_created, created);
  kernels::gemm(A, false, B, false, C, 1.0f, 1.0f);  // accumulate: a different primitive
  EXPECT_EQ(kernels::gemm_stats().primitives_created, created + 1);
}

// oneDNN's copies of the operands live in one scratchpad buffer that moecore keeps (Scratchpad, gemm_context.h),
// not in oneDNN's own, which it allocates around calls: repeated products use the same buffer and fault no pages in.
TEST(Gemm, OneKeptScratchpadServesRepeatedProducts) {
  if (!kernels::gemm_stats().bf16_native) GTEST_SKIP() << "no native bf16 matmul on this CPU (operands widened)";
  mallopt(M_MMAP_THRESHOLD, 128 * 1024);  // glibc's default, without its adaptive raise after a free
  // A weight gradient's shape (op(A) = Aᵀ, accumulating), for which oneDNN copies A into its scratchpad.
  const Tensor A = randn({1024, 256}, DType::F32, 1).to(DType::BF16);
  const Tensor B = randn({1024, 1024}, DType::F32, 2).to(DType::BF16);
  Tensor C = Tensor::zeros({256, 1024}, DType::F32);
  kernels::gemm(A, true, B, false, C, 1.0f, 1.0f);
  const Tensor first = C.clone();
  const int64_t scratch = kernels::gemm_stats().scratchpad_bytes;
  EXPECT_GE(scratch, 64 * 1024);  // the A copy is at least a few blocks of 32 rows
  auto minor_faults = [] {
    rusage u{};
    getrusage(RUSAGE_SELF, &u);
    return static_cast<int64_t>(u.ru_minflt);
  };
  const int64_t before = minor_faults();
  constexpr int kCalls = 8;
  for (int i = 0; i < kCalls; i++) {
    C.zero_();
    kernels::gemm(A, true, B, false, C, 1.0f, 1.0f);
  }
  EXPECT_LT(minor_faults() - before, kCalls);
  EXPECT_EQ(kernels::gemm_stats().scratchpad_bytes, scratch);
  EXPECT_TRUE(testing::bitwise_equal(C, first));
}

TEST(Gemm, EmptyReductionScalesC) {
  Tensor A = Tensor::empty({4, 0}, DType::F32), B = Tensor::empty({0, 3}, DType::F32);
  Tensor C = randn({4, 3}, DType::F32, 8);
  Tensor C0 = C.clone();
  kernels::gemm(A, false, B, false, C, 1.0f, 1.0f);
  EXPECT_TRUE(testing::bitwise_equal(C, C0));
  kernels::gemm(A, false, B, false, C);
  EXPECT_EQ(testing::max_rel_diff(C, Tensor::zeros({4, 3}, DType::F32)), 0.0);
}

TEST(Gemm, RejectsMismatchedShapes) {
  Tensor A = Tensor::empty({4, 5}, DType::F32), B = Tensor::empty({6, 3}, DType::F32);
  Tensor C = Tensor::empty({4, 3}, DType::F32);
  EXPECT_THROW(kernels::gemm(A, false, B, false, C), InternalError);
}

}  // namespace
}  // namespace moecore

namespace moecore {
namespace {

// One batched call equals a loop of 2-D products, for every transpose, in f32 (to rounding) and bf16.
TEST(Gemm, BatchedMatchesPerMatrixProducts) {
  const int64_t batch = 3, M = 17, N = 9, K = 12;
  for (DType dt : {DType::F32, DType::BF16})
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        Tensor A = testing::randn(ta ? Shape{batch, K, M} : Shape{batch, M, K}, DType::F32, 1).to(dt);
        Tensor B = testing::randn(tb ? Shape{batch, N, K} : Shape{batch, K, N}, DType::F32, 2).to(dt);
        Tensor C = testing::randn({batch, M, N}, DType::F32, 3), ref = C.clone();
        kernels::gemm_batched(A, ta, B, tb, C, 0.5f, 1.0f);
        for (int64_t i = 0; i < batch; i++) {
          Tensor a = A.slice(i, 1).reshape({A.dim(1), A.dim(2)}), b = B.slice(i, 1).reshape({B.dim(1), B.dim(2)});
          Tensor c = ref.slice(i, 1).reshape({M, N});
          kernels::gemm(a, ta, b, tb, c, 0.5f, 1.0f);
        }
        EXPECT_LT(testing::max_rel_diff(C, ref), 1e-6) << dtype_name(dt) << " ta=" << ta << " tb=" << tb;
      }
  Tensor A = Tensor::empty({2, 4, 5}, DType::F32), B = Tensor::empty({3, 5, 4}, DType::F32);
  Tensor C = Tensor::empty({2, 4, 4}, DType::F32);
  EXPECT_THROW(kernels::gemm_batched(A, false, B, false, C), InternalError);  // batch sizes differ
}

// Reductions of 16384 and more run in chunks accumulated into C: the result still equals the f64 product to f32
// rounding, for every transpose and with alpha/beta, and ragged chunk sizes.
TEST(Gemm, LongReductionsInChunksMatchF64) {
  const int64_t M = 6, N = 5, K = 20001;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      Tensor A = testing::randn(ta ? Shape{K, M} : Shape{M, K}, DType::F32, 4);
      Tensor B = testing::randn(tb ? Shape{N, K} : Shape{K, N}, DType::F32, 5);
      Tensor C = testing::randn({M, N}, DType::F32, 6);
      Tensor ref = gemm_reference(A, ta, B, tb, C, 0.5, 2.0);
      kernels::gemm(A, ta, B, tb, C, 0.5f, 2.0f);
      EXPECT_LT(testing::max_rel_diff(C, ref), 1e-5) << "ta=" << ta << " tb=" << tb;
    }
}

TEST(Gemm, PreparedPrimitiveIsTheOneGemmUses) {
  const int64_t M = 32, N = 48, K = 40;
  kernels::gemm_prepare(M, N, K, true, false, DType::BF16, 1.0f, 1.0f);
  const int64_t created = kernels::gemm_stats().primitives_created;
  Tensor A = testing::randn({K, M}, DType::F32, 7).to(DType::BF16),
         B = testing::randn({K, N}, DType::F32, 8).to(DType::BF16);
  Tensor C = Tensor::zeros({M, N}, DType::F32);
  kernels::gemm(A, true, B, false, C, 1.0f, 1.0f);
  EXPECT_EQ(kernels::gemm_stats().primitives_created, created);
  kernels::gemm_prepare(M, N, K, true, false, DType::BF16, 1.0f, 1.0f);  // already there
  EXPECT_EQ(kernels::gemm_stats().primitives_created, created);
}

// gemm_shape_stats: each primitive shape counts its own calls and FLOPs (what bench train lists by shape).
TEST(Gemm, ShapeStatsCountEachShapesCallsAndFlops) {
  auto find = [](const std::string& name) {
    for (const kernels::GemmShapeStats& g : kernels::gemm_shape_stats())
      if (g.describe() == name) return g;
    return kernels::GemmShapeStats{};
  };
  const Tensor a = randn({37, 23}, DType::F32, 1), b = randn({19, 23}, DType::F32, 2);
  Tensor c = Tensor::empty({37, 19}, DType::F32);
  const std::string name = "M=37 N=19 K=23 (Bᵀ) f32->f32";
  const kernels::GemmShapeStats before = find(name);
  for (int i = 0; i < 3; i++) kernels::gemm(a, false, b, true, c);
  const kernels::GemmShapeStats after = find(name);
  EXPECT_EQ(after.calls - before.calls, 3);
  EXPECT_DOUBLE_EQ(after.flops - before.flops, 3 * 2.0 * 37 * 19 * 23);
  EXPECT_GT(after.seconds, before.seconds);
  kernels::gemm(a, false, b, true, c, 1.0f, 1.0f);
  EXPECT_EQ(find(name + " +=").calls, 1) << "beta 1 is a shape of its own";
}

// The benchmarks' warning about an unsteady machine: peak samples 2x apart are flagged, 10% apart are not.
TEST(Gemm, PeakSwingFlagsAnUnsteadyMachine) {
  EXPECT_DOUBLE_EQ(kernels::peak_swing({700, 1400, 1000}), 2.0);
  EXPECT_GT(kernels::peak_swing({473, 1436}), kernels::kUnsteadyPeak);
  EXPECT_LT(kernels::peak_swing({900, 990, 950}), kernels::kUnsteadyPeak);
  EXPECT_DOUBLE_EQ(kernels::peak_swing({}), 1.0);
}

// Each run against the mean of the samples on either side of it: a run at half the peak while the machine slowed
// from 1,400 to 600 GFLOP/s is 0.5 of its moment's peak, whatever the run's median peak.
TEST(Gemm, PairedPeakRatiosCompareEachRunWithItsNeighbours) {
  const std::vector<double> r = kernels::paired_peak_ratios({700, 500, 300}, {1400, 1400, 600, 600});
  ASSERT_EQ(r.size(), 3u);
  EXPECT_DOUBLE_EQ(r[0], 0.5);
  EXPECT_DOUBLE_EQ(r[1], 0.5);
  EXPECT_DOUBLE_EQ(r[2], 0.5);
  // Earlier samples (one before a warm-up) are left out: the last rates + 1 bracket the runs.
  EXPECT_DOUBLE_EQ(kernels::paired_peak_ratios({100}, {9999, 200, 200}).at(0), 0.5);
  EXPECT_TRUE(kernels::paired_peak_ratios({100, 100}, {200, 200}).empty());
  EXPECT_TRUE(kernels::paired_peak_ratios({}, {200}).empty());
}

}  // namespace
}  // namespace moecore
