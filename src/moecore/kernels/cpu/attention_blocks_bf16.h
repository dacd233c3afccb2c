// Block products on bf16 operands with f32 accumulation for the native-bf16 flash attention kernel
// (attention_flash_native.cpp): C[M, N] f32 (+)= A[M, K]·B[K, N] through AVX512-BF16 (vdpbf16ps) or AMX (TDPBF16PS,
// native or emulated, amx_tiles.h). Both instructions read the same layouts, so one packing serves every backend:
//   A: row-major bf16, element (i, k) at A[i·lda + k] (k pairs adjacent);
//   B: "VNNI" pairs, element (k, n) at B[(k/2)·ldb + 2n + k%2] (ldb = 2 × the packed width).
// Shapes are padded by the caller: M a multiple of 16, N of 32, K of 32, padding zeros (finite). Not a general GEMM.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "moecore/core/dtype.h"
#include "moecore/kernels/cpu/amx_tiles.h"
#include "moecore/kernels/cpu/attention_blocks.h"

namespace moecore::kernels::flash {

// Which native instructions run the products. AmxEmulated is the AMX code path with the scalar tile emulation: it
// runs on any CPU (slowly) so that AMX's blocking is tested where there is no AMX.
enum class NativeBf16 { Avx512Bf16, AmxEmulated, Amx };
const char* native_bf16_name(NativeBf16 b);
// Whether this CPU (and OS) runs backend b.
bool native_bf16_supported(NativeBf16 b);

// Ceil to a multiple of m.
constexpr int64_t round_up(int64_t x, int64_t m) {
  return (x + m - 1) / m * m;
}

// One block product, as Causal says for a diagonal tile (attention_blocks.h), at the backend's row-block
// granularity: ColsUpToRow leaves columns past a row block's last row (rounded up to 32) unwritten, KUpToRow and
// KFromRow skip k outside the row block's range (rounded outwards to whole pairs or tiles; the skipped A or B terms
// must be zero); KFromCol skips k before a 32-column block's first column (rounded down likewise). Each element sums
// its k in a fixed order (ascending pairs or 32-wide tiles), whatever the thread.
struct Bf16Block {
  int64_t M, N, K;
  const bf16* A;
  int64_t lda;
  const bf16* B;
  int64_t ldb;
  float* C;
  int64_t ldc;
  bool accumulate;
  Causal mode;
};

// The backends: run(p) computes one product; begin()/end() bracket a thread's run of products (AMX configures its
// tiles once per work item, as other code on the thread, oneDNN's, may reconfigure them in between).
struct Avx512Bf16Blocks {
  static void begin() {}
  static void end() {}
  static void run(const Bf16Block& p);
};
template <class Tiles>
struct AmxBlocks {
  static void begin();
  static void end();
  static void run(const Bf16Block& p);
};

// The k range and column count a row block [i0, i0 + rows) needs under `mode`, k rounded outwards to multiples of
// kq (a pair or a tile's 32), columns up to a multiple of 32.
struct Bf16Range {
  int64_t k0, k1, n;
};
inline Bf16Range bf16_block_range(const Bf16Block& p, int64_t i0, int64_t rows, int64_t kq) {
  Bf16Range r{0, p.K, p.N};
  if (p.mode == Causal::ColsUpToRow) r.n = std::min(p.N, round_up(i0 + rows, 32));
  if (p.mode == Causal::KUpToRow) r.k1 = std::min(p.K, round_up(i0 + rows, kq));
  if (p.mode == Causal::KFromRow) r.k0 = std::min(p.K, i0 / kq * kq);
  return r;
}
// The first k that column block j0 needs (KFromCol) given its row block's range.
inline int64_t bf16_col_k0(const Bf16Block& p, const Bf16Range& r, int64_t j0, int64_t kq) {
  return p.mode == Causal::KFromCol ? std::max(r.k0, std::min(p.K, j0 / kq * kq)) : r.k0;
}

#define MOE_AVX512_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

// MR rows × NV vectors of 16 columns over the pairs [k0/2, k1/2): A's pair broadcast as one 32-bit element.
template <int MR, int NV>
MOE_AVX512_BF16 MOE_ALWAYS_INLINE void dp_micro(const Bf16Block& p, int64_t i0, int64_t j0, int64_t k0, int64_t k1) {
  __m512 acc[MR][NV];
#pragma GCC unroll 8
  for (int i = 0; i < MR; i++)
#pragma GCC unroll 4
    for (int v = 0; v < NV; v++)
      acc[i][v] = p.accumulate ? _mm512_loadu_ps(p.C + (i0 + i) * p.ldc + j0 + 16 * v) : _mm512_setzero_ps();
  const bf16* a = p.A + i0 * p.lda + k0;
  const bf16* bk = p.B + (k0 / 2) * p.ldb + 2 * j0;
  for (int64_t k = k0; k < k1; k += 2, a += 2, bk += p.ldb) {
    __m512bh bv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; v++) bv[v] = (__m512bh)_mm512_loadu_si512(bk + 32 * v);
#pragma GCC unroll 8
    for (int i = 0; i < MR; i++) {
      int32_t pair;
      std::memcpy(&pair, a + i * p.lda, 4);
      const __m512bh av = (__m512bh)_mm512_set1_epi32(pair);
#pragma GCC unroll 4
      for (int v = 0; v < NV; v++) acc[i][v] = _mm512_dpbf16_ps(acc[i][v], av, bv[v]);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; i++)
#pragma GCC unroll 4
    for (int v = 0; v < NV; v++) _mm512_storeu_ps(p.C + (i0 + i) * p.ldc + j0 + 16 * v, acc[i][v]);
}

// 4 rows × 4 vectors (64 columns): 16 accumulators, 4 B vectors and a broadcast of 32 registers; 32-column rests
// take 4 × 2.
constexpr int kDpRows = 4;

MOE_AVX512_BF16 inline void avx512_bf16_block(const Bf16Block& p) {
  for (int64_t i0 = 0; i0 < p.M; i0 += kDpRows) {
    const Bf16Range r = bf16_block_range(p, i0, kDpRows, 2);
    int64_t j0 = 0;
    for (; j0 + 64 <= r.n; j0 += 64) dp_micro<kDpRows, 4>(p, i0, j0, bf16_col_k0(p, r, j0, 2), r.k1);
    if (j0 < r.n) dp_micro<kDpRows, 2>(p, i0, j0, bf16_col_k0(p, r, j0, 2), r.k1);
  }
}

// MB × NB tiles of 16 × 16 (C tiles 0..3, A tiles 4..5, B tiles 6..7) over k tiles [k0, k1) of 32.
template <class Tiles, int MB, int NB>
MOE_ALWAYS_INLINE void amx_micro(const Bf16Block& p, int64_t i0, int64_t j0, int64_t k0, int64_t k1) {
  const int64_t c_stride = p.ldc * 4, a_stride = p.lda * 2, b_stride = p.ldb * 2;
  auto c_at = [&](int m, int n) { return p.C + (i0 + 16 * m) * p.ldc + j0 + 16 * n; };
  if (p.accumulate) {
    Tiles::template load<0>(c_at(0, 0), c_stride);
    if constexpr (NB > 1) Tiles::template load<1>(c_at(0, 1), c_stride);
    if constexpr (MB > 1) Tiles::template load<2>(c_at(1, 0), c_stride);
    if constexpr (MB > 1 && NB > 1) Tiles::template load<3>(c_at(1, 1), c_stride);
  } else {
    Tiles::template zero<0>();
    if constexpr (NB > 1) Tiles::template zero<1>();
    if constexpr (MB > 1) Tiles::template zero<2>();
    if constexpr (MB > 1 && NB > 1) Tiles::template zero<3>();
  }
  for (int64_t k = k0; k < k1; k += 32) {
    Tiles::template load<4>(p.A + i0 * p.lda + k, a_stride);
    if constexpr (MB > 1) Tiles::template load<5>(p.A + (i0 + 16) * p.lda + k, a_stride);
    const bf16* bk = p.B + (k / 2) * p.ldb + 2 * j0;
    Tiles::template load<6>(bk, b_stride);
    if constexpr (NB > 1) Tiles::template load<7>(bk + 32, b_stride);
    Tiles::template dp<0, 4, 6>();
    if constexpr (NB > 1) Tiles::template dp<1, 4, 7>();
    if constexpr (MB > 1) Tiles::template dp<2, 5, 6>();
    if constexpr (MB > 1 && NB > 1) Tiles::template dp<3, 5, 7>();
  }
  Tiles::template store<0>(c_at(0, 0), c_stride);
  if constexpr (NB > 1) Tiles::template store<1>(c_at(0, 1), c_stride);
  if constexpr (MB > 1) Tiles::template store<2>(c_at(1, 0), c_stride);
  if constexpr (MB > 1 && NB > 1) Tiles::template store<3>(c_at(1, 1), c_stride);
}

inline void Avx512Bf16Blocks::run(const Bf16Block& p) {
  avx512_bf16_block(p);
}

template <class Tiles>
void AmxBlocks<Tiles>::begin() {
  Tiles::configure();
}
template <class Tiles>
void AmxBlocks<Tiles>::end() {
  Tiles::release();
}

// Row blocks of 32 (two A tiles), columns in 32s (two B tiles): each A and B tile loaded serves two products.
template <class Tiles>
void AmxBlocks<Tiles>::run(const Bf16Block& p) {
  for (int64_t i0 = 0; i0 < p.M; i0 += 32) {
    const bool two_rows = i0 + 32 <= p.M;
    const Bf16Range r = bf16_block_range(p, i0, two_rows ? 32 : 16, 32);
    for (int64_t j0 = 0; j0 < r.n; j0 += 32) {
      if (two_rows)
        amx_micro<Tiles, 2, 2>(p, i0, j0, bf16_col_k0(p, r, j0, 32), r.k1);
      else
        amx_micro<Tiles, 1, 2>(p, i0, j0, bf16_col_k0(p, r, j0, 32), r.k1);
    }
  }
}

}  // namespace moecore::kernels::flash
