// Tensor views, dtype conversion, the caching allocator's statistics, Philox known answers and layout-independent
// draws; the copy of the hot loops the CPU cap allows.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "moecore/core/allocator.h"
#include "moecore/core/cpu.h"
#include "moecore/core/rng.h"
#include "moecore/core/tensor.h"
#include "moecore/nn/parameter.h"
#include "test_util.h"

namespace moecore {
namespace {

TEST(Tensor, SliceAndReshapeAreViews) {
  Tensor t = Tensor::empty({4, 3}, DType::F32);
  for (int i = 0; i < 12; i++) t.set_item(i, i);
  Tensor s = t.slice(1, 2);
  EXPECT_EQ(s.shape(), Shape({2, 3}));
  EXPECT_TRUE(s.shares_storage(t));
  EXPECT_EQ(s.item(0), 3.0);
  s.set_item(5, -1.0);
  EXPECT_EQ(t.item(8), -1.0);
  Tensor r = t.reshape({2, 2, 3});
  EXPECT_EQ(r.numel(), 12);
  EXPECT_EQ(r.item(8), -1.0);
  EXPECT_THROW(t.reshape({5, 3}), InternalError);
  EXPECT_THROW(t.slice(3, 2), InternalError);
  EXPECT_THROW(t.data<double>(), InternalError);
}

// Large tensors are copied and zeroed in 256 KiB pieces over the threads: every piece, the last partial one too,
// and nothing outside the view.
TEST(Tensor, LargeCopiesAndZeroingCoverEveryPiece) {
  const int64_t n = (int64_t(3) << 20) / 4 + 1234;  // ~3 MiB of f32: 12 pieces and a partial one
  Tensor whole = testing::randn({n + 2}, DType::F32, 3);
  const Tensor src = testing::randn({n}, DType::F32, 4);
  Tensor view = whole.slice(1, n);
  view.copy_from(src);
  EXPECT_TRUE(testing::bitwise_equal(view, src));
  const double before = whole.item(0), after = whole.item(n + 1);
  view.zero_();
  for (int64_t i = 0; i < n; i += 997) ASSERT_EQ(view.item(i), 0.0) << i;
  EXPECT_EQ(view.item(n - 1), 0.0);
  EXPECT_EQ(whole.item(0), before);
  EXPECT_EQ(whole.item(n + 1), after);
}

TEST(Tensor, AllDtypes) {
  for (DType dt : {DType::F32, DType::BF16, DType::F64, DType::I32, DType::I64}) {
    Tensor t = Tensor::zeros({3, 5}, dt);
    EXPECT_EQ(t.nbytes(), 15 * dtype_size(dt));
    t.set_item(7, 3.0);
    EXPECT_EQ(t.item(7), 3.0) << dtype_name(dt);
    EXPECT_EQ(t.item(6), 0.0);
  }
}

TEST(Tensor, Bf16RoundsToNearestEven) {
  EXPECT_EQ(float_to_bf16(1.0f).bits, 0x3F80);
  // 1 + 2^-8 is exactly halfway between 1 and 1 + 2^-7: ties to even (1.0).
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f + 1.0f / 256)), 1.0f);
  // 1 + 3·2^-8 is halfway between 1 + 2^-7 and 1 + 2^-6: ties to even (1 + 2^-6).
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f + 3.0f / 256)), 1.0f + 1.0f / 64);
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(NAN))));
  Tensor f = testing::randn({1000}, DType::F32, 1);
  Tensor b = f.to(DType::BF16).to(DType::F32);
  for (int64_t i = 0; i < 1000; i++) EXPECT_NEAR(b.item(i), f.item(i), std::fabs(f.item(i)) * (1.0 / 256) + 1e-30);
}

TEST(Allocator, CachesAndCountsSystemAllocations) {
  Allocator& a = Allocator::instance();
  { Tensor warm = Tensor::empty({1000, 37}, DType::F32); }
  const AllocatorMark m = a.mark();
  const int64_t live0 = a.stats().live_bytes;
  for (int i = 0; i < 10; i++) {
    Tensor t = Tensor::empty({1000, 37}, DType::F32);
    EXPECT_GE(a.stats().live_bytes - live0, 1000 * 37 * 4);
  }
  EXPECT_EQ(a.system_allocs_since(m), 0) << "a freed block of the same class must be reused";
  EXPECT_EQ(a.requests_since(m), 10);
  EXPECT_EQ(a.stats().live_bytes, live0);
  a.reset_peak();
  a.empty_cache();  // earlier tests of this process may have left a block of big's class in the cache
  { Tensor big = Tensor::empty({1 << 20}, DType::F32); }
  EXPECT_GE(a.stats().peak_bytes - live0, (1 << 20) * 4);
  EXPECT_EQ(a.system_allocs_since(m), 1);
}

TEST(Allocator, SizeClassesWasteLittle) {
  for (size_t b : {1ul, 63ul, 64ul, 4096ul, 4097ul, 100000ul, 1ul << 30}) {
    const size_t r = Allocator::round_size(b);
    EXPECT_GE(r, b);
    EXPECT_LE(r, std::max<size_t>(64, b + b / 8 + 64));
    EXPECT_EQ(r % 64, 0u);
  }
}

// Known-answer vectors from the Random123 distribution (kat_vectors, philox4x32_10).
TEST(Philox, KnownAnswers) {
  EXPECT_EQ(philox4x32_10({0, 0, 0, 0}, {0, 0}), (Philox4{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}));
  EXPECT_EQ(philox4x32_10({0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff}),
            (Philox4{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}));
  EXPECT_EQ(philox4x32_10({0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0}),
            (Philox4{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}));
}

TEST(Philox, NormalMomentsAndIndependenceOfSharding) {
  Philox r(5, stream_id("w"));
  double s = 0, s2 = 0;
  const int n = 200000;
  for (int i = 0; i < n; i++) {
    const double x = r.normal(i);
    s += x;
    s2 += x * x;
  }
  EXPECT_NEAR(s / n, 0.0, 0.01);
  EXPECT_NEAR(s2 / n, 1.0, 0.01);
  // A shard initialized from its global offset equals the same slice of the whole tensor.
  Tensor whole = Tensor::empty({8, 16}, DType::F32);
  nn::init_tensor(whole, "layer.weight", nn::InitRule::normal(0.02), 1234);
  Tensor shard = Tensor::empty({3, 16}, DType::F32);
  nn::init_tensor(shard, "layer.weight", nn::InitRule::normal(0.02), 1234, 5 * 16);
  EXPECT_TRUE(testing::bitwise_equal(shard, whole.slice(5, 3)));
  Tensor other = Tensor::empty({8, 16}, DType::F32);
  nn::init_tensor(other, "layer.bias_or_other", nn::InitRule::normal(0.02), 1234);
  EXPECT_FALSE(testing::bitwise_equal(other, whole));
}

TEST(Errors, CheckAndAssertCarryMessages) {
  try {
    MOE_CHECK(1 + 1 == 3, "--foo {} is invalid; use a value below {}", 7, 5);
    FAIL();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "--foo 7 is invalid; use a value below 5");
  }
  try {
    MOE_ASSERT(2 < 1);
    FAIL();
  } catch (const InternalError& e) {
    EXPECT_NE(std::string(e.what()).find("test_core.cpp"), std::string::npos);
  }
}

// The MOE_CPU_CLONES loops run no copy above MOECORE_MAX_CPU_ISA's cap (x86-64-v4 only where AVX-512 is allowed,
// x86-64-v3 only where AVX2 is), and uncapped the copy GCC's target_clones would pick from CPUID. CTest
// unit_tests_capped_at_avx2 runs this under MOECORE_MAX_CPU_ISA=avx2.
TEST(Cpu, CloneLevelNeverExceedsTheCap) {
  const CloneLevel level = clone_level();
  if (!cpu_isa_allowed(CpuIsa::Avx512)) {
    EXPECT_NE(level, CloneLevel::V4);
  }
  if (!cpu_isa_allowed(CpuIsa::Avx2)) {
    EXPECT_EQ(level, CloneLevel::Baseline);
  }
  const char* cap = std::getenv("MOECORE_MAX_CPU_ISA");
  if (cap && std::string(cap) == "avx2") {
    EXPECT_NE(level, CloneLevel::V4) << clone_level_name(level);
  }
#if MOE_HAVE_CPU_CLONES
  if (max_cpu_isa() == CpuIsa::Amx) {  // no cap
    const CloneLevel cpuid = __builtin_cpu_supports("x86-64-v4")   ? CloneLevel::V4
                             : __builtin_cpu_supports("x86-64-v3") ? CloneLevel::V3
                                                                   : CloneLevel::Baseline;
    EXPECT_EQ(level, cpuid) << clone_level_name(level);
  }
#else
  EXPECT_EQ(level, CloneLevel::Baseline);  // one copy
#endif
}

}  // namespace
}  // namespace moecore
