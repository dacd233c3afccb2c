// Dropout (see dropout.h). y = x ⊙ z with z ∈ {0, 1/(1−p)} a function of the element's global coordinates, so
// dx = dy ⊙ z: backward is the forward applied to the gradient with the regenerated mask.
#include "moecore/kernels/dropout.h"

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cmath>

#include "moecore/core/cpu.h"
#include "moecore/core/rng.h"
#include "moecore/kernels/backends.h"
#include "moecore/kernels/cpu/kernels.h"
#include "moecore/kernels/dropout_philox.h"

namespace moecore::kernels {

namespace {
DropoutMask with_key(double p, uint64_t key) {
  MOE_ASSERT_MSG(p >= 0 && p < 1, "dropout probability {} outside [0, 1)", p);
  DropoutMask m;
  m.p = p;
  m.key[0] = static_cast<uint32_t>(key);
  m.key[1] = static_cast<uint32_t>(key >> 32);
  m.threshold = static_cast<uint32_t>(std::min(4294967295.0, std::round(p * 4294967296.0)));
  return m;
}
}  // namespace

// The keys come from dropout_philox.h, which the CUDA kernels share.
DropoutMask DropoutMask::make(uint64_t seed, uint64_t site, double p) {
  return with_key(p, dropout_philox::site_key(seed, site));
}

DropoutMask DropoutMask::sub(uint64_t index) const {
  return with_key(p, dropout_philox::sub_key(key64(), index));
}

namespace {
constexpr int kLanes = 16;  // Philox blocks computed together (64 multipliers)

bool philox_avx512() {
  static const bool avx512 =
      __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("bmi2") && cpu_isa_allowed(CpuIsa::Avx512);
  return avx512;
}

// Philox4x32-10 (the rounds of core/rng.cpp) of the `nb` ≤ kLanes counters (c0 + i, c1, c2, c3), lane by lane in
// structure-of-arrays form so the rounds vectorize; words [4, kLanes] out (out[w][i] = word w of block i).
MOE_ALWAYS_INLINE void philox_lanes_any_body(const uint32_t key[2], uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3,
                                             int nb, uint32_t out[4][kLanes]) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u, kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  uint32_t x0[kLanes], x1[kLanes], x2[kLanes], x3[kLanes];
  for (int i = 0; i < kLanes; i++) {
    x0[i] = c0 + static_cast<uint32_t>(i);
    x1[i] = c1;
    x2[i] = c2;
    x3[i] = c3;
  }
  uint32_t k0 = key[0], k1 = key[1];
  for (int r = 0; r < 10; r++) {
    if (r > 0) {
      k0 += kW0;
      k1 += kW1;
    }
#pragma omp simd
    for (int i = 0; i < kLanes; i++) {
      const uint64_t p0 = static_cast<uint64_t>(kM0) * x0[i], p1 = static_cast<uint64_t>(kM1) * x2[i];
      const uint32_t y0 = static_cast<uint32_t>(p1 >> 32) ^ x1[i] ^ k0,
                     y2 = static_cast<uint32_t>(p0 >> 32) ^ x3[i] ^ k1;
      x1[i] = static_cast<uint32_t>(p1);
      x3[i] = static_cast<uint32_t>(p0);
      x0[i] = y0;
      x2[i] = y2;
    }
  }
  for (int i = 0; i < nb; i++) {
    out[0][i] = x0[i];
    out[1][i] = x1[i];
    out[2][i] = x2[i];
    out[3][i] = x3[i];
  }
}
void philox_lanes_any(const uint32_t key[2], uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, int nb,
                      uint32_t out[4][kLanes]) {
  MOE_CPU_CLONES(philox_lanes_any_body(key, c0, c1, c2, c3, nb, out));
}

// The same rounds with AVX-512 intrinsics, all 16 lanes: both halves of the 32×32-bit products come from vpmuludq on
// the even lanes and on the odd lanes shifted down, where the compiler's vectorization of the portable
// form widens every lane to 64 bits and multiplies with vpmullq (2x the time on AMD Zen 5, same bits). x: word w of
// block i in lane i of x[w].
// GCC 12's AVX-512 headers fill unused lanes with _mm512_undefined_epi32(), which -Wuninitialized flags.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#define MOE_PHILOX_AVX512 __attribute__((target("avx512f,bmi2")))
// NR independent runs of 16 blocks, counters (c0 + i, c1[n], c2, c3), their rounds interleaved: one run's rounds are
// a dependency chain twice as long as its operations' throughput, so two runs fill each other's gaps.
template <int NR>
MOE_PHILOX_AVX512 MOE_ALWAYS_INLINE void philox_rounds_avx512(const uint32_t key[2], uint32_t c0, const uint32_t* c1,
                                                              uint32_t c2, uint32_t c3, __m512i (&x)[NR][4]) {
  const __m512i m0 = _mm512_set1_epi32(static_cast<int>(0xD2511F53u));
  const __m512i m1 = _mm512_set1_epi32(static_cast<int>(0xCD9E8D57u));
  const __m512i lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  for (int n = 0; n < NR; n++) {
    x[n][0] = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(c0)), lanes);
    x[n][1] = _mm512_set1_epi32(static_cast<int>(c1[n]));
    x[n][2] = _mm512_set1_epi32(static_cast<int>(c2));
    x[n][3] = _mm512_set1_epi32(static_cast<int>(c3));
  }
  uint32_t k0 = key[0], k1 = key[1];
  for (int r = 0; r < 10; r++) {
    if (r > 0) {
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
    for (int n = 0; n < NR; n++) {
      const __m512i x0 = x[n][0], x2 = x[n][2];
      const __m512i e0 = _mm512_mul_epu32(x0, m0), o0 = _mm512_mul_epu32(_mm512_srli_epi64(x0, 32), m0);
      const __m512i e2 = _mm512_mul_epu32(x2, m1), o2 = _mm512_mul_epu32(_mm512_srli_epi64(x2, 32), m1);
      const __m512i hi0 = _mm512_mask_blend_epi32(0xAAAA, _mm512_srli_epi64(e0, 32), o0);
      const __m512i hi2 = _mm512_mask_blend_epi32(0xAAAA, _mm512_srli_epi64(e2, 32), o2);
      // The low halves from the same products (vpmulld is two multiplier uops on Intel).
      const __m512i lo0 = _mm512_mask_blend_epi32(0xAAAA, e0, _mm512_slli_epi64(o0, 32));
      const __m512i lo2 = _mm512_mask_blend_epi32(0xAAAA, e2, _mm512_slli_epi64(o2, 32));
      x[n][0] = _mm512_ternarylogic_epi32(hi2, x[n][1], _mm512_set1_epi32(static_cast<int>(k0)), 0x96);
      x[n][2] = _mm512_ternarylogic_epi32(hi0, x[n][3], _mm512_set1_epi32(static_cast<int>(k1)), 0x96);
      x[n][1] = lo2;
      x[n][3] = lo0;
    }
  }
}
#pragma GCC diagnostic pop

MOE_PHILOX_AVX512 void philox_lanes_avx512(const uint32_t key[2], uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3,
                                           uint32_t out[4][kLanes]) {
  __m512i x[1][4];
  philox_rounds_avx512<1>(key, c0, &c1, c2, c3, x);
  for (int w = 0; w < 4; w++) _mm512_storeu_si512(out[w], x[0][w]);
}

// The keep bits of the 64 elements of blocks c0 .. c0 + 15 of rows c1[0 .. NR): bit 4i + w is word w of block i at or
// above threshold, the four 16-bit compare masks interleaved by pdep.
template <int NR>
MOE_PHILOX_AVX512 void philox_keep_bits_avx512(const uint32_t key[2], uint32_t c0, const uint32_t* c1, uint32_t c2,
                                               uint32_t c3, uint32_t threshold, uint64_t* bits) {
  __m512i x[NR][4];
  philox_rounds_avx512<NR>(key, c0, c1, c2, c3, x);
  const __m512i t = _mm512_set1_epi32(static_cast<int>(threshold));
  for (int n = 0; n < NR; n++) {
    bits[n] = 0;
    for (int w = 0; w < 4; w++) bits[n] |= _pdep_u64(_mm512_cmpge_epu32_mask(x[n][w], t), 0x1111111111111111ull << w);
  }
}

// Philox4x32-10 of the counters (c0 + i, c1, c2, c3), i < nb ≤ kLanes: AVX-512 where the CPU has it.
void philox_lanes(const uint32_t key[2], uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, int nb,
                  uint32_t out[4][kLanes]) {
  if (philox_avx512())
    philox_lanes_avx512(key, c0, c1, c2, c3, out);
  else
    philox_lanes_any(key, c0, c1, c2, c3, nb, out);
}

template <typename T>
MOE_ALWAYS_INLINE void dropout_multipliers_body(const DropoutMask& m, uint64_t sample, uint64_t row, uint64_t col0,
                                                int64_t n, T* z) {
  if (n <= 0) return;
  const T keep = static_cast<T>(1.0 / (1.0 - m.p));
  const uint32_t r = static_cast<uint32_t>(row), n0 = static_cast<uint32_t>(sample),
                 n1 = static_cast<uint32_t>(sample >> 32);
  uint32_t w[4][kLanes];
  const uint64_t first = col0 / 4, last = (col0 + static_cast<uint64_t>(n) - 1) / 4;
  for (uint64_t blk = first; blk <= last; blk += kLanes) {
    const int nb = static_cast<int>(std::min<uint64_t>(kLanes, last - blk + 1));
    philox_lanes(m.key, static_cast<uint32_t>(blk), r, n0, n1, nb, w);
    const uint64_t base = blk * 4;
    if (base >= col0 && base + 4 * static_cast<uint64_t>(nb) <= col0 + static_cast<uint64_t>(n)) {
      // Every column of these blocks is wanted (all but a row's first and last blocks): no per-column checks.
      T* zb = z + (base - col0);
      for (int i = 0; i < nb; i++)
        for (int k = 0; k < 4; k++) zb[i * 4 + k] = w[k][i] >= m.threshold ? keep : T(0);
      continue;
    }
    for (int i = 0; i < nb; i++)
      for (uint64_t k = 0; k < 4; k++) {
        const uint64_t col = (blk + static_cast<uint64_t>(i)) * 4 + k;
        if (col < col0 || col >= col0 + static_cast<uint64_t>(n)) continue;
        z[col - col0] = w[k][i] >= m.threshold ? keep : T(0);
      }
  }
}
}  // namespace

template <typename T>
void dropout_multipliers(const DropoutMask& m, uint64_t sample, uint64_t row, uint64_t col0, int64_t n, T* z) {
  MOE_CPU_CLONES(dropout_multipliers_body(m, sample, row, col0, n, z));
}

void dropout_keep_bits(const DropoutMask& m, uint64_t sample, uint64_t row0, int rows, uint64_t col0, int64_t n,
                       uint64_t* bits) {
  MOE_ASSERT_MSG(n >= 1 && n <= 64 && rows >= 1, "dropout_keep_bits of {} rows of {} elements (1 to 64)", rows, n);
  const uint64_t wanted = n == 64 ? ~0ull : (1ull << n) - 1;
  const uint32_t c0 = static_cast<uint32_t>(col0 / 4), n0 = static_cast<uint32_t>(sample),
                 n1 = static_cast<uint32_t>(sample >> 32);
  int r = 0;
  if (col0 % 4 == 0 && philox_avx512()) {
    for (; r + 2 <= rows; r += 2) {
      const uint32_t c1[2] = {static_cast<uint32_t>(row0 + r), static_cast<uint32_t>(row0 + r + 1)};
      philox_keep_bits_avx512<2>(m.key, c0, c1, n0, n1, m.threshold, bits + r);
    }
    if (r < rows) {
      const uint32_t c1 = static_cast<uint32_t>(row0 + r);
      philox_keep_bits_avx512<1>(m.key, c0, &c1, n0, n1, m.threshold, bits + r);
      r++;
    }
  }
  for (; r < rows; r++) {
    float z[64];
    dropout_multipliers(m, sample, row0 + r, col0, n, z);
    bits[r] = 0;
    for (int64_t c = 0; c < n; c++) bits[r] |= static_cast<uint64_t>(z[c] != 0.0f) << c;
  }
  for (r = 0; r < rows; r++) bits[r] &= wanted;
}

template void dropout_multipliers<float>(const DropoutMask&, uint64_t, uint64_t, uint64_t, int64_t, float*);
template void dropout_multipliers<double>(const DropoutMask&, uint64_t, uint64_t, uint64_t, int64_t, double*);

namespace {
template <typename T>
MOE_ALWAYS_INLINE void apply_mask_body(const DropoutMask& m, const T* x, T* y, const int64_t* sample_B, int64_t B,
                                       int64_t seq_offset, int64_t rows, int64_t C) {
  constexpr int64_t kChunk = 64;  // columns per mask word
  const T keep = static_cast<T>(1.0 / (1.0 - m.p));
#pragma omp for schedule(static)
  for (int64_t t = 0; t < rows; t++) {
    const int64_t s = t / B, b = t % B;
    for (int64_t c0 = 0; c0 < C; c0 += kChunk) {
      const int64_t n = std::min(kChunk, C - c0);
      uint64_t bits;
      dropout_keep_bits(m, static_cast<uint64_t>(sample_B[b]), static_cast<uint64_t>(seq_offset + s), 1,
                        static_cast<uint64_t>(c0), n, &bits);
      const T* xr = x + t * C + c0;
      T* yr = y + t * C + c0;
      // Multiplied by 0 where dropped, as by the multipliers: a NaN or infinity stays one.
      for (int64_t h = 0; h < n; h += 32) {
        const uint32_t word = static_cast<uint32_t>(bits >> h);
        const int64_t e = std::min<int64_t>(32, n - h);
#pragma omp simd
        for (int64_t c = 0; c < e; c++) yr[h + c] = xr[h + c] * (((word >> c) & 1u) ? keep : T(0));
      }
    }
  }
}
template <typename T>
void apply_mask(const DropoutMask& m, const T* x, T* y, const int64_t* sample_B, int64_t B, int64_t seq_offset,
                int64_t rows, int64_t C) {
#pragma omp parallel
  MOE_CPU_CLONES(apply_mask_body(m, x, y, sample_B, B, seq_offset, rows, C));
}
}  // namespace

// The CPU backend of dropout_forward (kernels/dispatch.cpp checks the shapes and handles p = 0). dropout_backward is
// the same call on the gradient: dx = dy ⊙ z with the mask regenerated.
void cpu::dropout_forward(const Tensor& x, const DropoutMask& m, const std::vector<int64_t>& sample_B,
                          int64_t seq_offset, Tensor& y) {
  const int64_t B = static_cast<int64_t>(sample_B.size());
  const int64_t C = x.dim(x.ndim() - 1), rows = x.numel() / C;
  MOE_DISPATCH_FLOAT(x.dtype(), T,
                     { apply_mask<T>(m, x.data<T>(), y.data<T>(), sample_B.data(), B, seq_offset, rows, C); });
}

}  // namespace moecore::kernels

namespace moecore::kernels::cpu {

// This backend's table (kernels/backends.h).
const DropoutKernels kDropoutKernels{dropout_forward};

}  // namespace moecore::kernels::cpu
