// Dropout masks over global coordinates (kernels/cpu/dropout.h) and attention dropout inside both attention
// kernels: the drop rate, the scaling, independence from how a tensor is split, and fp64 finite differences with
// fixed masks (the same coordinates in every evaluation).
#include <gtest/gtest.h>

#include <cmath>

#include "kernels/dropout_golden.h"
#include "moecore/core/rng.h"
#include "moecore/kernels/attention.h"
#include "moecore/kernels/dropout.h"
#include "moecore/kernels/elementwise.h"
#include "test_util.h"

namespace moecore {
namespace {

using kernels::DropoutMask;
using testing::fd_rel_error;
using testing::kGradTol;
using testing::randn;

TEST(Dropout, RateAndScale) {
  for (double p : {0.1, 0.5, 0.9}) {
    const DropoutMask m = DropoutMask::make(1234, 7, p);
    const int64_t n = 1 << 18;
    std::vector<double> z(static_cast<size_t>(n));
    kernels::dropout_multipliers(m, 3, 5, 0, n, z.data());
    int64_t dropped = 0;
    for (double v : z) {
      if (v == 0)
        dropped++;
      else
        EXPECT_EQ(v, 1.0 / (1.0 - p));
    }
    // 5 standard deviations of a binomial(n, p).
    EXPECT_NEAR(static_cast<double>(dropped) / n, p, 5 * std::sqrt(p * (1 - p) / n)) << "p=" << p;
  }
  // p = 0: everything kept at scale 1, and the tensor passes unchanged.
  Tensor x = randn({4, 2, 8}, DType::F32, 1), y = Tensor::empty(x.shape(), DType::F32);
  kernels::dropout_forward(x, DropoutMask::make(1, 2, 0.0), {0, 1}, 0, y);
  EXPECT_TRUE(testing::bitwise_equal(x, y));
}

// Each multiplier is word col % 4 of the Philox4x32-10 block (col / 4, row, sample low, sample high) under the mask's
// key, computed one block at a time by core/rng — whichever path the kernel takes (AVX-512 intrinsics where the CPU
// has them, the portable vectorized rounds elsewhere), over rows and column ranges that start and end mid-block.
TEST(Dropout, MultipliersAreCoreRngsPhiloxWords) {
  const DropoutMask m = DropoutMask::make(77, 5, 0.25);
  const double keep = 1.0 / (1.0 - 0.25);
  for (uint64_t sample : {uint64_t{3}, (uint64_t{5} << 32) | 9})
    for (uint64_t row : {uint64_t{0}, uint64_t{4097}})
      for (uint64_t col0 : {uint64_t{0}, uint64_t{3}, uint64_t{130}}) {
        const int64_t n = 203;
        std::vector<double> z(static_cast<size_t>(n));
        kernels::dropout_multipliers(m, sample, row, col0, n, z.data());
        for (int64_t i = 0; i < n; i++) {
          const uint64_t col = col0 + static_cast<uint64_t>(i);
          const Philox4 w = philox4x32_10({static_cast<uint32_t>(col / 4), static_cast<uint32_t>(row),
                                           static_cast<uint32_t>(sample), static_cast<uint32_t>(sample >> 32)},
                                          {m.key[0], m.key[1]});
          ASSERT_EQ(z[static_cast<size_t>(i)], w[col % 4] >= m.threshold ? keep : 0.0)
              << "sample " << sample << " row " << row << " col " << col;
        }
      }
}

// The keep bits the native attention kernel reads are the multipliers' mask: bit c set exactly where multiplier c
// keeps, for whole 64-column runs at multiples of 4 (the AVX-512 compare path where the CPU has it), runs that
// start mid-block (the multipliers' path) and short runs (the bits past n clear), three rows at a time (a pair whose
// rounds interleave, then one), at several drop rates.
TEST(Dropout, KeepBitsAreTheMultipliersMask) {
  for (double p : {0.1, 0.5, 0.9}) {
    const DropoutMask m = DropoutMask::make(13, 4, p);
    for (uint64_t sample : {uint64_t{0}, (uint64_t{7} << 32) | 2})
      for (uint64_t row : {uint64_t{5}, uint64_t{70000}})
        for (uint64_t col0 : {uint64_t{0}, uint64_t{64}, uint64_t{4}, uint64_t{1}, uint64_t{127}})
          for (int64_t n : {int64_t{64}, int64_t{63}, int64_t{17}, int64_t{1}}) {
            uint64_t bits[3];
            kernels::dropout_keep_bits(m, sample, row, 3, col0, n, bits);
            for (int r = 0; r < 3; r++) {
              float z[64];
              kernels::dropout_multipliers(m, sample, row + static_cast<uint64_t>(r), col0, n, z);
              for (int64_t c = 0; c < 64; c++)
                ASSERT_EQ((bits[r] >> c) & 1, c < n && z[c] != 0.0f ? 1u : 0u)
                    << "p " << p << " sample " << sample << " row " << row + static_cast<uint64_t>(r) << " col0 "
                    << col0 << " n " << n << " bit " << c;
            }
          }
  }
}

// The multiplier of an element depends on its coordinates only: any column split, a sequence shard with its offset,
// and the order of the samples in a batch give the same values; another sample, row, seed, site or sub-mask does not.
TEST(Dropout, MaskDependsOnGlobalCoordinatesOnly) {
  const DropoutMask m = DropoutMask::make(42, 9, 0.3);
  std::vector<float> whole(100), parts(100);
  kernels::dropout_multipliers(m, 11, 6, 0, 100, whole.data());
  kernels::dropout_multipliers(m, 11, 6, 0, 37, parts.data());
  kernels::dropout_multipliers(m, 11, 6, 37, 2, parts.data() + 37);
  kernels::dropout_multipliers(m, 11, 6, 39, 61, parts.data() + 39);
  EXPECT_EQ(whole, parts);
  auto differs = [&](const DropoutMask& m2, uint64_t sample, uint64_t row) {
    std::vector<float> other(100);
    kernels::dropout_multipliers(m2, sample, row, 0, 100, other.data());
    return other != whole;
  };
  EXPECT_TRUE(differs(m, 12, 6));
  EXPECT_TRUE(differs(m, 11, 7));
  EXPECT_TRUE(differs(DropoutMask::make(43, 9, 0.3), 11, 6));
  EXPECT_TRUE(differs(DropoutMask::make(42, 10, 0.3), 11, 6));
  EXPECT_TRUE(differs(m.sub(1), 11, 6));
  EXPECT_FALSE(differs(DropoutMask::make(42, 9, 0.3), 11, 6));
  // Each multiplier is word c%4 of the core Philox4x32-10 block at counter (c/4, row, sample) against p·2³² (the
  // kernel computes 16 blocks at once; here one at a time), for a sample index above 2³².
  const uint64_t big = (uint64_t(5) << 32) + 9;
  std::vector<double> z(301);
  kernels::dropout_multipliers(m, big, 70000, 3, 301, z.data());
  for (uint64_t c = 3; c < 304; c++) {
    const Philox4 w = philox4x32_10({static_cast<uint32_t>(c / 4), 70000u, 9u, 5u}, {m.key[0], m.key[1]});
    EXPECT_EQ(z[c - 3], w[c % 4] >= m.threshold ? 1.0 / 0.7 : 0.0) << "column " << c;
  }

  // [S=6, B=2, H=40] in one call against two sequence shards of 3 positions, and against the batch reversed.
  Tensor x = randn({6, 2, 40}, DType::F64, 3), y = Tensor::empty(x.shape(), DType::F64);
  kernels::dropout_forward(x, m, {100, 200}, 0, y);
  for (int64_t half = 0; half < 2; half++) {
    Tensor xs = x.slice(half * 3, 3).clone(), ys = Tensor::empty(xs.shape(), DType::F64);
    kernels::dropout_forward(xs, m, {100, 200}, half * 3, ys);
    EXPECT_TRUE(testing::bitwise_equal(ys, y.slice(half * 3, 3).clone())) << "shard " << half;
  }
  Tensor xr = Tensor::empty(x.shape(), DType::F64), yr = Tensor::empty(x.shape(), DType::F64);
  for (int64_t s = 0; s < 6; s++)
    for (int64_t b = 0; b < 2; b++)
      for (int64_t h = 0; h < 40; h++) xr.set_item((s * 2 + b) * 40 + h, x.item((s * 2 + 1 - b) * 40 + h));
  kernels::dropout_forward(xr, m, {200, 100}, 0, yr);
  for (int64_t s = 0; s < 6; s++)
    for (int64_t b = 0; b < 2; b++)
      for (int64_t h = 0; h < 40; h++) EXPECT_EQ(yr.item((s * 2 + b) * 40 + h), y.item((s * 2 + 1 - b) * 40 + h));
}

// The CPU kernels draw the golden masks (kernels/dropout_golden.h) that the CUDA kernels are held to in
// tests/cuda_emulate: hidden dropout through dropout_forward on ones, attention dropout through rows_bits (the native
// kernel's keep bits) and row() (the flash kernel's multipliers), over every (query, key) pair.
TEST(Dropout, CpuDrawsTheGoldenMasks) {
  namespace golden = testing::dropout_golden;
  for (const golden::HiddenCase& c : golden::kHidden) {
    Tensor x = Tensor::empty({c.S, c.B, c.C}, DType::F32), y = Tensor::empty(x.shape(), DType::F32);
    kernels::fill_(x, 1.0);
    const std::vector<int64_t> samples(c.sample, c.sample + c.B);
    kernels::dropout_forward(x, DropoutMask::make(c.seed, c.site, c.p), samples, c.seq_offset, y);
    uint64_t h = golden::kFnvStart;
    int64_t kept = 0;
    for (int64_t i = 0; i < y.numel(); i++) {
      h = golden::fnv_add(h, y.data<float>()[i] != 0.0f);
      kept += y.data<float>()[i] != 0.0f;
    }
    EXPECT_EQ(h, c.hash) << "hidden case p=" << c.p << " C=" << c.C << std::hex << ": hash 0x" << h;
    EXPECT_EQ(kept, c.kept) << "hidden case p=" << c.p << " C=" << c.C;
  }
  for (const golden::AttentionCase& c : golden::kAttention) {
    kernels::AttentionDropout d;
    d.mask = DropoutMask::make(c.seed, c.site, c.p);
    d.sample_B = c.sample;
    d.head_offset = c.head_offset;
    d.seq_offset = c.seq_offset;
    d.key_offset = c.key_offset;
    uint64_t h = golden::kFnvStart, h_bits = golden::kFnvStart;
    int64_t kept = 0;
    std::vector<float> z(static_cast<size_t>(c.S));
    for (int64_t b = 0; b < c.B; b++)
      for (int64_t hd = 0; hd < c.Nq; hd++)
        for (int64_t i = 0; i < c.S; i++) {
          d.row(b, hd, i, 0, c.S, z.data());
          for (int64_t j = 0; j < c.S; j++) {
            h = golden::fnv_add(h, z[static_cast<size_t>(j)] != 0.0f);
            kept += z[static_cast<size_t>(j)] != 0.0f;
          }
          for (int64_t j0 = 0; j0 < c.S; j0 += 64) {
            const int64_t n = std::min<int64_t>(64, c.S - j0);
            uint64_t bits;
            d.rows_bits(d.head_mask(hd), b, i, 1, j0, n, &bits);
            for (int64_t j = 0; j < n; j++) h_bits = golden::fnv_add(h_bits, (bits >> j) & 1);
          }
        }
    EXPECT_EQ(h, c.hash) << "attention case p=" << c.p << " S=" << c.S << std::hex << ": hash 0x" << h;
    EXPECT_EQ(h_bits, c.hash) << "attention case p=" << c.p << " S=" << c.S << ": rows_bits";
    EXPECT_EQ(kept, c.kept) << "attention case p=" << c.p << " S=" << c.S;
  }
}

TEST(DropoutGrad, FiniteDifferences) {
  const DropoutMask m = DropoutMask::make(5, 6, 0.25);
  Tensor x = randn({5, 3, 16}, DType::F64, 1), W = randn(x.shape(), DType::F64, 2);
  const std::vector<int64_t> samples = {7, 8, 9};
  auto loss = [&] {
    Tensor y = Tensor::empty(x.shape(), DType::F64);
    kernels::dropout_forward(x, m, samples, 2, y);
    return kernels::dot(y, W);
  };
  Tensor dx = Tensor::empty(x.shape(), DType::F64);
  kernels::dropout_backward(W, m, samples, 2, dx);
  EXPECT_LT(fd_rel_error(loss, x, dx, 240), kGradTol);
  // In place, as the model applies it.
  Tensor y = x.clone();
  kernels::dropout_forward(y, m, samples, 2, y);
  Tensor y2 = Tensor::empty(x.shape(), DType::F64);
  kernels::dropout_forward(x, m, samples, 2, y2);
  EXPECT_TRUE(testing::bitwise_equal(y, y2));
}

// Attention with dropout by the definition: softmax over visible keys, multipliers from the same coordinates,
// o = Σ_j p_j·z_j·v_j (f64, no tiles).
Tensor naive_dropout_attention(const Tensor& q, const Tensor& k, const Tensor& v, double scale,
                               const kernels::AttentionDropout& d) {
  const int64_t S = q.dim(0), B = q.dim(1), Nq = q.dim(2), Nkv = k.dim(2), D = q.dim(3);
  Tensor o = Tensor::zeros(q.shape(), DType::F64);
  for (int64_t b = 0; b < B; b++)
    for (int64_t h = 0; h < Nq; h++) {
      const int64_t g = h / (Nq / Nkv);
      for (int64_t i = 0; i < S; i++) {
        std::vector<double> p(static_cast<size_t>(i + 1)), z(static_cast<size_t>(i + 1));
        double mx = -1e300, sum = 0;
        for (int64_t j = 0; j <= i; j++) {
          double s = 0;
          for (int64_t e = 0; e < D; e++)
            s += q.item(((i * B + b) * Nq + h) * D + e) * k.item(((j * B + b) * Nkv + g) * D + e);
          p[j] = s * scale;
          mx = std::max(mx, p[j]);
        }
        for (auto& x : p) sum += (x = std::exp(x - mx));
        d.row(b, h, i, 0, i + 1, z.data());
        for (int64_t e = 0; e < D; e++) {
          double acc = 0;
          for (int64_t j = 0; j <= i; j++) acc += p[j] / sum * z[j] * v.item(((j * B + b) * Nkv + g) * D + e);
          o.set_item(((i * B + b) * Nq + h) * D + e, acc);
        }
      }
    }
  return o;
}

struct DropoutCase {
  int64_t S, B, Nq, Nkv, D;
};

kernels::AttentionDropout attention_dropout(const std::vector<int64_t>& samples, double p) {
  kernels::AttentionDropout d;
  d.mask = DropoutMask::make(77, 3, p);
  d.sample_B = samples.data();
  d.head_offset = 2;
  return d;
}

TEST(AttentionDropoutGrad, TiledKernelMatchesDefinitionAndFiniteDifferences) {
  // S=70 crosses a key tile with a ragged last tile; GQA.
  for (DropoutCase c : {DropoutCase{5, 2, 2, 1, 4}, DropoutCase{70, 2, 4, 2, 4}}) {
    const std::vector<int64_t> samples = {13, 4};
    const kernels::AttentionDropout d = attention_dropout(samples, 0.3);
    Tensor q = randn({c.S, c.B, c.Nq, c.D}, DType::F64, 1), k = randn({c.S, c.B, c.Nkv, c.D}, DType::F64, 2);
    Tensor v = randn({c.S, c.B, c.Nkv, c.D}, DType::F64, 3), W = randn(q.shape(), DType::F64, 4);
    const double scale = 1.0 / std::sqrt(static_cast<double>(c.D));
    Tensor o = Tensor::empty(q.shape(), DType::F64), lse = Tensor::empty({c.B, c.Nq, c.S}, DType::F64);
    kernels::attention_forward(q, k, v, scale, o, lse, &d);
    EXPECT_LT(testing::max_rel_diff(o, naive_dropout_attention(q, k, v, scale, d)), 1e-12) << "S=" << c.S;
    Tensor o0 = Tensor::empty(q.shape(), DType::F64);
    kernels::attention_forward(q, k, v, scale, o0, lse);
    EXPECT_GT(testing::max_rel_diff(o, o0), 1e-3) << "dropout changed nothing";
    kernels::attention_forward(q, k, v, scale, o, lse, &d);
    auto loss = [&] {
      Tensor o2 = Tensor::empty(q.shape(), DType::F64), l2 = Tensor::empty({c.B, c.Nq, c.S}, DType::F64);
      kernels::attention_forward(q, k, v, scale, o2, l2, &d);
      return kernels::dot(o2, W);
    };
    Tensor dq = Tensor::empty(q.shape(), DType::F64), dk = Tensor::empty(k.shape(), DType::F64),
           dv = Tensor::empty(v.shape(), DType::F64);
    kernels::attention_backward(W, q, k, v, o, lse, scale, dq, dk, dv, &d);
    EXPECT_LT(fd_rel_error(loss, q, dq, 150), kGradTol) << "S=" << c.S;
    EXPECT_LT(fd_rel_error(loss, k, dk, 150), kGradTol) << "S=" << c.S;
    EXPECT_LT(fd_rel_error(loss, v, dv, 150), kGradTol) << "S=" << c.S;
  }
}

// The bf16 kernel drops the same probabilities: against the f64 tiled kernel with the same dropout, within bf16
// rounding, and far from the result without dropout.
TEST(AttentionDropout, Bf16KernelDropsTheSameProbabilities) {
  for (DropoutCase c : {DropoutCase{70, 2, 4, 2, 16}, DropoutCase{301, 1, 3, 1, 8}}) {
    const std::vector<int64_t> samples = {5, 6};
    const kernels::AttentionDropout d = attention_dropout(samples, 0.2);
    Tensor q = randn({c.S, c.B, c.Nq, c.D}, DType::F64, 1), k = randn({c.S, c.B, c.Nkv, c.D}, DType::F64, 2);
    Tensor v = randn({c.S, c.B, c.Nkv, c.D}, DType::F64, 3), g = randn(q.shape(), DType::F64, 4);
    const double scale = 1.0 / std::sqrt(static_cast<double>(c.D));
    Tensor o = Tensor::empty(q.shape(), DType::F64), lse = Tensor::empty({c.B, c.Nq, c.S}, DType::F64);
    Tensor dq = Tensor::empty(q.shape(), DType::F64), dk = Tensor::empty(k.shape(), DType::F64),
           dv = Tensor::empty(v.shape(), DType::F64);
    kernels::attention_forward(q, k, v, scale, o, lse, &d);
    kernels::attention_backward(g, q, k, v, o, lse, scale, dq, dk, dv, &d);
    Tensor q32 = q.to(DType::F32), k32 = k.to(DType::F32), v32 = v.to(DType::F32), g32 = g.to(DType::F32);
    Tensor o2 = Tensor::empty(q.shape(), DType::F32), lse2 = Tensor::empty({c.B, c.Nq, c.S}, DType::F32);
    Tensor dq2 = Tensor::empty(q.shape(), DType::F32), dk2 = Tensor::empty(k.shape(), DType::F32),
           dv2 = Tensor::empty(v.shape(), DType::F32);
    kernels::attention_forward_bf16(q32, k32, v32, scale, o2, lse2, &d);
    kernels::attention_backward_bf16(g32, q32, k32, v32, o2, lse2, scale, dq2, dk2, dv2, &d);
    EXPECT_LT(testing::max_rel_diff(o2, o), 1e-2) << "S=" << c.S;
    EXPECT_LT(testing::max_rel_diff(dq2, dq), 2e-2) << "S=" << c.S;
    EXPECT_LT(testing::max_rel_diff(dk2, dk), 2e-2) << "S=" << c.S;
    EXPECT_LT(testing::max_rel_diff(dv2, dv), 2e-2) << "S=" << c.S;
    Tensor o3 = Tensor::empty(q.shape(), DType::F32);
    kernels::attention_forward_bf16(q32, k32, v32, scale, o3, lse2);
    EXPECT_GT(testing::max_rel_diff(o3, o), 5e-2) << "S=" << c.S << ": dropout changed nothing";
  }
}

}  // namespace
}  // namespace moecore
