// The native-bf16 flash attention kernel (kernels/cpu/attention_flash_native.cpp) on each backend: AVX512-BF16 and
// AMX where the CPU has them, the AMX code path through the scalar tile emulation everywhere. Forward o and lse and
// backward dq, dk, dv against an f64 reference and against the f32 flash kernel with the same bf16 rounding points,
// over ragged and single-row sequences, GQA, head widths 64, 128 and 80 (padded to 96); reruns and thread counts
// give identical bits; outputs are nat_poisoned with NaN first so that an unwritten element fails.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "moecore/kernels/attention.h"
#include "moecore/kernels/cpu/amx_tiles.h"
#include "moecore/kernels/cpu/attention_flash.h"
#include "moecore/kernels/cpu/attention_flash_native.h"
#include "test_util.h"

namespace moecore {
namespace {

using kernels::flash::NativeBf16;
using testing::randn;

struct NatDims {
  int64_t S, B, Nq, Nkv, D;
  std::string str() const {
    return "S=" + std::to_string(S) + " B=" + std::to_string(B) + " heads=" + std::to_string(Nq) + "/" +
           std::to_string(Nkv) + " D=" + std::to_string(D);
  }
};

struct NatOuts {
  Tensor o, lse, dq, dk, dv;
};

struct NatInputs {
  Tensor q, k, v, g;
  NatInputs(const NatDims& c, DType dt) {
    q = randn({c.S, c.B, c.Nq, c.D}, DType::F64, 21).to(dt);
    k = randn({c.S, c.B, c.Nkv, c.D}, DType::F64, 22).to(dt);
    v = randn({c.S, c.B, c.Nkv, c.D}, DType::F64, 23).to(dt);
    g = randn(q.shape(), DType::F64, 24).to(dt);
  }
};

Tensor nat_poisoned(const Shape& s, DType dt) {
  Tensor t = Tensor::empty(s, dt);
  if (dt == DType::F32)
    std::fill_n(t.data<float>(), t.numel(), std::numeric_limits<float>::quiet_NaN());
  else
    std::fill_n(t.data<double>(), t.numel(), std::numeric_limits<double>::quiet_NaN());
  return t;
}

// kind: the native backend, or -1: the f32 flash kernel with bf16 rounding, or -2: f64 (no rounding).
NatOuts nat_run(const NatDims& c, int kind, const kernels::AttentionDropout* drop) {
  const DType dt = kind == -2 ? DType::F64 : DType::F32;
  const NatInputs in(c, dt);
  NatOuts r{nat_poisoned(in.q.shape(), dt), nat_poisoned({c.B, c.Nq, c.S}, dt), nat_poisoned(in.q.shape(), dt),
            nat_poisoned(in.k.shape(), dt), nat_poisoned(in.v.shape(), dt)};
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.D));
  if (kind >= 0) {
    const auto b = static_cast<NativeBf16>(kind);
    kernels::flash::forward_native(in.q, in.k, in.v, scale, r.o, r.lse, drop, b);
    kernels::flash::backward_native(in.g, in.q, in.k, in.v, r.o, r.lse, scale, r.dq, r.dk, r.dv, drop, b);
  } else {
    kernels::flash::forward(in.q, in.k, in.v, scale, r.o, r.lse, drop, kind == -1);
    kernels::flash::backward(in.g, in.q, in.k, in.v, r.o, r.lse, scale, r.dq, r.dk, r.dv, drop, kind == -1);
  }
  return r;
}

kernels::AttentionDropout nat_drop(const std::vector<int64_t>& samples) {
  kernels::AttentionDropout d;
  d.mask = kernels::DropoutMask::make(77, 3, 0.15);
  d.sample_B = samples.data();
  d.head_offset = 2;
  return d;
}

// Largest |a − b| over the largest |b| (as testing::max_rel_diff), NaN counted as an infinite error. At S = 1 the
// exact dq and dk are zero (one key: dS = dP − Δ = 0) and what remains is bf16 rounding of dP = dÔ·V̂ against the
// f32 Δ, so there the error is taken relative to the call's gradient scale, the largest |dv| (= |dO| at S = 1).
double nat_err(const Tensor& a, const Tensor& b, double floor = 0) {
  double num = 0, den = floor;
  for (int64_t i = 0; i < a.numel(); i++) {
    if (std::isnan(a.item(i))) return std::numeric_limits<double>::infinity();
    num = std::max(num, std::fabs(a.item(i) - b.item(i)));
    den = std::max(den, std::fabs(b.item(i)));
  }
  return num / std::max(den, 1e-300);
}

double nat_max_abs(const Tensor& t) {
  double m = 0;
  for (int64_t i = 0; i < t.numel(); i++) m = std::max(m, std::fabs(t.item(i)));
  return m;
}

// bf16 tolerances of FlashAttention.BothBf16KernelsWithinBf16Rounding: 1e-2 on o and lse, 2e-2 on the gradients.
void nat_expect_close(const NatOuts& x, const NatOuts& ref, const std::string& what) {
  const double floor = x.lse.dim(-1) == 1 ? nat_max_abs(ref.dv) : 0.0;
  const double eo = nat_err(x.o, ref.o), el = nat_err(x.lse, ref.lse), eq = nat_err(x.dq, ref.dq, floor),
               ek = nat_err(x.dk, ref.dk, floor), ev = nat_err(x.dv, ref.dv);
  EXPECT_LT(eo, 1e-2) << what << ": o error " << eo;
  EXPECT_LT(el, 1e-2) << what << ": lse error " << el;
  EXPECT_LT(eq, 2e-2) << what << ": dq error " << eq;
  EXPECT_LT(ek, 2e-2) << what << ": dk error " << ek;
  EXPECT_LT(ev, 2e-2) << what << ": dv error " << ev;
}

void nat_same_bits(const NatOuts& a, const NatOuts& b, const std::string& what) {
  EXPECT_TRUE(testing::bitwise_equal(a.o, b.o)) << what << ": o";
  EXPECT_TRUE(testing::bitwise_equal(a.lse, b.lse)) << what << ": lse";
  EXPECT_TRUE(testing::bitwise_equal(a.dq, b.dq)) << what << ": dq";
  EXPECT_TRUE(testing::bitwise_equal(a.dk, b.dk)) << what << ": dk";
  EXPECT_TRUE(testing::bitwise_equal(a.dv, b.dv)) << what << ": dv";
}

std::vector<NatDims> nat_shapes(bool small) {
  std::vector<NatDims> out;
  for (int64_t S : {1, 17, 64, 200, 1000}) {
    if (small && S > 200) {
      out.push_back({S, 2, 4, 2, 64});
      continue;
    }
    out.push_back({S, 2, 4, 2, 64});
    out.push_back({S, 2, 8, 1, 128});
    out.push_back({S, 2, 4, 2, 80});
  }
  return out;
}

// Every shape against f64 and against the f32 flash kernel with the same rounding points; one with dropout.
void nat_check_backend(NativeBf16 b, bool small) {
  const std::vector<int64_t> samples = {5, 1};
  const kernels::AttentionDropout drop = nat_drop(samples);
  for (const NatDims& c : nat_shapes(small)) {
    const std::string what = std::string(kernels::flash::native_bf16_name(b)) + " " + c.str();
    const NatOuts x = nat_run(c, static_cast<int>(b), nullptr), f64 = nat_run(c, -2, nullptr);
    nat_expect_close(x, f64, what + " vs f64");
    nat_expect_close(x, nat_run(c, -1, nullptr), what + " vs f32 flash with bf16 rounding");
    EXPECT_GT(nat_err(x.o, f64.o), 1e-6) << what << ": no bf16 rounding at all?";
  }
  const NatDims c{200, 2, 4, 2, 80};
  nat_expect_close(nat_run(c, static_cast<int>(b), &drop), nat_run(c, -2, &drop),
                   std::string(kernels::flash::native_bf16_name(b)) + " " + c.str() + " with dropout vs f64");
}

// Reruns, and 1 thread (fused backward) against 2 (two passes: one kv head), give identical bits, with dropout.
void nat_check_determinism(NativeBf16 b) {
  const std::vector<int64_t> samples = {3};
  const kernels::AttentionDropout drop = nat_drop(samples);
  const NatDims c{200, 1, 3, 1, 64};
  const int before = omp_get_max_threads();
  omp_set_num_threads(1);
  const NatOuts one = nat_run(c, static_cast<int>(b), &drop);
  omp_set_num_threads(2);
  const NatOuts two = nat_run(c, static_cast<int>(b), &drop), again = nat_run(c, static_cast<int>(b), &drop);
  omp_set_num_threads(before);
  const std::string name = kernels::flash::native_bf16_name(b);
  nat_same_bits(one, two, name + ": 1 vs 2 threads");
  nat_same_bits(two, again, name + ": rerun");
}

TEST(FlashNativeBf16, Avx512Bf16MatchesReferences) {
  if (!kernels::flash::native_bf16_supported(NativeBf16::Avx512Bf16)) GTEST_SKIP() << "this CPU has no AVX512-BF16";
  nat_check_backend(NativeBf16::Avx512Bf16, false);
}

TEST(FlashNativeBf16, Avx512Bf16IsDeterministic) {
  if (!kernels::flash::native_bf16_supported(NativeBf16::Avx512Bf16)) GTEST_SKIP() << "this CPU has no AVX512-BF16";
  nat_check_determinism(NativeBf16::Avx512Bf16);
}

// The AMX blocking (two row tiles × two column tiles, k in tiles of 32, causal ranges per 32 rows) through the
// emulated tiles: fewer nat_shapes, the emulation being scalar.
TEST(FlashNativeBf16, AmxEmulatedMatchesReferences) {
  nat_check_backend(NativeBf16::AmxEmulated, true);
}

TEST(FlashNativeBf16, AmxEmulatedIsDeterministic) {
  nat_check_determinism(NativeBf16::AmxEmulated);
}

TEST(FlashNativeBf16, AmxMatchesReferencesAndEmulation) {
  if (!kernels::flash::native_bf16_supported(NativeBf16::Amx))
    GTEST_SKIP() << "this CPU (or its kernel) offers no AMX tiles";
  nat_check_backend(NativeBf16::Amx, false);
  nat_check_determinism(NativeBf16::Amx);
  // The instructions and the emulation nat_run the same blocking: equal up to how TDPBF16PS rounds inside a pair.
  const NatDims c{200, 2, 4, 2, 80};
  const NatOuts hw = nat_run(c, static_cast<int>(NativeBf16::Amx), nullptr);
  const NatOuts em = nat_run(c, static_cast<int>(NativeBf16::AmxEmulated), nullptr);
  nat_expect_close(hw, em, "AMX vs emulated AMX " + c.str());
}

// TDPBF16PS as emulated on one tile product with operands whose products and sums are exact in f32: C = A·B exactly,
// B read in VNNI pairs.
TEST(FlashNativeBf16, EmulatedTileProductIsExact) {
  using T = kernels::amx::Emulated;
  bf16 a[16][32], b[16][32];
  float c[16][16], want[16][16] = {};
  for (int m = 0; m < 16; m++)
    for (int k = 0; k < 32; k++) a[m][k] = float_to_bf16(static_cast<float>((m * 7 + k * 3) % 11 - 5));
  for (int k = 0; k < 32; k++)
    for (int n = 0; n < 16; n++) b[k / 2][2 * n + k % 2] = float_to_bf16(static_cast<float>((k * 5 + n) % 9 - 4));
  for (int m = 0; m < 16; m++)
    for (int n = 0; n < 16; n++) {
      c[m][n] = static_cast<float>(m - n);
      want[m][n] = c[m][n];
      for (int k = 0; k < 32; k++) want[m][n] += bf16_to_float(a[m][k]) * bf16_to_float(b[k / 2][2 * n + k % 2]);
    }
  T::load<0>(c, 64);
  T::load<4>(a, 64);
  T::load<6>(b, 64);
  T::dp<0, 4, 6>();
  T::store<0>(c, 64);
  for (int m = 0; m < 16; m++)
    for (int n = 0; n < 16; n++) EXPECT_EQ(c[m][n], want[m][n]) << "m=" << m << " n=" << n;
}

// Training's choice: the native kernel wherever the CPU has one of its instruction sets.
TEST(FlashNativeBf16, PickedWhereSupported) {
  const bool native = kernels::flash::has_native_bf16();
  EXPECT_EQ(kernels::bf16_attention_kernel() == kernels::Bf16AttentionKernel::FlashNative, native);
}

}  // namespace
}  // namespace moecore
