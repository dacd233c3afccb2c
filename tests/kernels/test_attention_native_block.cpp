// The native-bf16 attention blocks for context parallelism (attention_flash_native_block.cpp), on AVX512-BF16 where
// the CPU has it and on the emulated AMX path everywhere: o, lse and the backward's dq term, dk, dv against the f32
// flash block kernel with the same rounding points and against f64 — over blocks whose offsets fall inside tiles,
// blocks wholly visible, a diagonal block, a block no row sees (o 0, lse −inf, no dq term, dk = dv = 0), GQA and
// dropout; and the block at (0, 0) gives the whole-sequence native kernel's bits.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "moecore/kernels/attention.h"
#include "moecore/kernels/cpu/attention_flash.h"
#include "moecore/kernels/cpu/attention_flash_native.h"
#include "test_util.h"

namespace moecore {
namespace {

using kernels::flash::NativeBf16;

struct BlockCase {
  int64_t Sq, Sk, q0, k0, Nq, Nkv, D;
  std::string str() const {
    return "Sq=" + std::to_string(Sq) + " Sk=" + std::to_string(Sk) + " q0=" + std::to_string(q0) +
           " k0=" + std::to_string(k0) + " heads=" + std::to_string(Nq) + "/" + std::to_string(Nkv) +
           " D=" + std::to_string(D);
  }
};

struct BlockOut {
  Tensor o, lse, dq_term, dk, dv;
};

// kind: a native backend, or -1: the f32 flash block kernel with bf16 rounding, or -2: f64.
BlockOut block_run(const BlockCase& c, int kind, const kernels::AttentionDropout* drop) {
  const DType dt = kind == -2 ? DType::F64 : DType::F32;
  const int64_t B = 2;
  const Tensor q = testing::randn({c.Sq, B, c.Nq, c.D}, DType::F64, 41).to(dt);
  const Tensor k = testing::randn({c.Sk, B, c.Nkv, c.D}, DType::F64, 42).to(dt);
  const Tensor v = testing::randn({c.Sk, B, c.Nkv, c.D}, DType::F64, 43).to(dt);
  const Tensor g = testing::randn(q.shape(), DType::F64, 44).to(dt);
  const Tensor dq0 = testing::randn(q.shape(), DType::F64, 45).to(dt);  // what the term is added to
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.D));
  BlockOut r{Tensor::empty(q.shape(), dt), Tensor::empty({B, c.Nq, c.Sq}, dt), Tensor(), Tensor::empty(k.shape(), dt),
             Tensor::empty(v.shape(), dt)};
  Tensor dq = dq0.clone();
  if (kind >= 0) {
    const auto b = static_cast<NativeBf16>(kind);
    kernels::AttentionDropout shifted;  // as attention_block_* hands it on: the block's own positions
    if (drop) {
      shifted = *drop;
      shifted.seq_offset = drop->seq_offset + c.q0;
      shifted.key_offset = (drop->key_offset < 0 ? drop->seq_offset : drop->key_offset) + c.k0;
    }
    const kernels::AttentionDropout* d = drop ? &shifted : nullptr;
    kernels::flash::block_forward_native(q, k, v, c.q0, c.k0, scale, r.o, r.lse, d, b);
    kernels::flash::block_backward_native(g, q, k, v, r.o, r.lse, c.q0, c.k0, scale, dq, r.dk, r.dv, d, b);
  } else if (kind == -1) {
    kernels::flash::block_forward_rounded(q, k, v, c.q0, c.k0, scale, r.o, r.lse, drop);
    kernels::flash::block_backward_rounded(g, q, k, v, r.o, r.lse, c.q0, c.k0, scale, dq, r.dk, r.dv, drop);
  } else {
    kernels::attention_block_forward(q, k, v, c.q0, c.k0, scale, r.o, r.lse, drop);
    kernels::attention_block_backward(g, q, k, v, r.o, r.lse, c.q0, c.k0, scale, dq, r.dk, r.dv, drop);
  }
  r.dq_term = dq.to(DType::F64);
  const Tensor before = dq0.to(DType::F64);
  for (int64_t i = 0; i < r.dq_term.numel(); i++) r.dq_term.set_item(i, r.dq_term.item(i) - before.item(i));
  return r;
}

// Largest |a − b| over the largest |b|, with −inf lse entries required on both sides alike.
double block_err(const Tensor& a, const Tensor& b) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < a.numel(); i++) {
    const double x = a.item(i), y = b.item(i);
    if (std::isinf(x) || std::isinf(y)) {
      if (x != y) return std::numeric_limits<double>::infinity();
      continue;
    }
    if (std::isnan(x)) return std::numeric_limits<double>::infinity();
    num = std::max(num, std::fabs(x - y));
    den = std::max(den, std::fabs(y));
  }
  return den == 0 ? num : num / den;
}

void expect_close(const BlockOut& x, const BlockOut& ref, const std::string& what) {
  EXPECT_LT(block_err(x.o, ref.o), 1e-2) << what << " o";
  EXPECT_LT(block_err(x.lse, ref.lse), 1e-2) << what << " lse";
  EXPECT_LT(block_err(x.dq_term, ref.dq_term), 2e-2) << what << " dq";
  EXPECT_LT(block_err(x.dk, ref.dk), 2e-2) << what << " dk";
  EXPECT_LT(block_err(x.dv, ref.dv), 2e-2) << what << " dv";
}

std::vector<NativeBf16> block_backends() {
  std::vector<NativeBf16> out = {NativeBf16::AmxEmulated};
  if (kernels::flash::native_bf16_supported(NativeBf16::Avx512Bf16)) out.push_back(NativeBf16::Avx512Bf16);
  if (kernels::flash::native_bf16_supported(NativeBf16::Amx)) out.push_back(NativeBf16::Amx);
  return out;
}

const std::vector<BlockCase> kBlockCases = {
    {100, 130, 130, 0, 4, 2, 64},   // after its keys: wholly visible
    {100, 100, 50, 50, 4, 2, 64},   // the diagonal, off tile boundaries
    {70, 90, 40, 60, 2, 1, 80},     // partly visible, keys start past some rows
    {150, 40, 200, 170, 4, 4, 32},  // GQA 1, keys straddling the rows' positions
    {64, 64, 0, 100, 2, 1, 64},     // no row sees a key
};

TEST(FlashNativeBf16Block, MatchesTheFlashBlockKernelAndF64) {
  for (NativeBf16 b : block_backends())
    for (const BlockCase& c : kBlockCases) {
      const std::string what = std::string(kernels::flash::native_bf16_name(b)) + " " + c.str();
      const BlockOut x = block_run(c, static_cast<int>(b), nullptr);
      expect_close(x, block_run(c, -1, nullptr), what + " vs f32 flash with bf16 rounding");
      expect_close(x, block_run(c, -2, nullptr), what + " vs f64");
    }
  const BlockCase none = kBlockCases.back();  // nothing visible: exact zeros and −inf
  const BlockOut x = block_run(none, static_cast<int>(NativeBf16::AmxEmulated), nullptr);
  for (int64_t i = 0; i < x.lse.numel(); i++) EXPECT_EQ(x.lse.item(i), -std::numeric_limits<double>::infinity());
  for (const Tensor* t : {&x.o, &x.dq_term, &x.dk, &x.dv})
    for (int64_t i = 0; i < t->numel(); i++) ASSERT_EQ(t->item(i), 0.0);
}

TEST(FlashNativeBf16Block, DropoutMatchesTheFlashBlockKernel) {
  const std::vector<int64_t> samples = {7, 2};
  kernels::AttentionDropout drop;
  drop.mask = kernels::DropoutMask::make(91, 5, 0.2);
  drop.sample_B = samples.data();
  drop.seq_offset = 30;
  const BlockCase c{90, 120, 100, 10, 4, 2, 64};
  for (NativeBf16 b : block_backends())
    expect_close(block_run(c, static_cast<int>(b), &drop), block_run(c, -2, &drop),
                 std::string(kernels::flash::native_bf16_name(b)) + " with dropout vs f64");
}

// The block at (0, 0) over the whole sequence is the whole-sequence native kernel: the same operands, products and
// order; the masked products only add zeros.
TEST(FlashNativeBf16Block, BlockAtTheOriginIsTheWholeKernel) {
  for (NativeBf16 b : block_backends()) {
    const BlockCase c{150, 150, 0, 0, 4, 2, 64};
    const BlockOut blk = block_run(c, static_cast<int>(b), nullptr);
    const Tensor q = testing::randn({c.Sq, 2, c.Nq, c.D}, DType::F64, 41).to(DType::F32);
    const Tensor k = testing::randn({c.Sk, 2, c.Nkv, c.D}, DType::F64, 42).to(DType::F32);
    const Tensor v = testing::randn({c.Sk, 2, c.Nkv, c.D}, DType::F64, 43).to(DType::F32);
    Tensor o = Tensor::empty(q.shape(), DType::F32), lse = Tensor::empty({2, c.Nq, c.Sq}, DType::F32);
    kernels::flash::forward_native(q, k, v, 1.0 / std::sqrt(static_cast<double>(c.D)), o, lse, nullptr, b);
    const std::string what = kernels::flash::native_bf16_name(b);
    EXPECT_TRUE(testing::bitwise_equal(blk.o, o)) << what << " o";
    EXPECT_TRUE(testing::bitwise_equal(blk.lse, lse)) << what << " lse";
  }
}

}  // namespace
}  // namespace moecore
