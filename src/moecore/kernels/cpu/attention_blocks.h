// Register-blocked small GEMMs for the flash attention kernels (attention_flash.cpp): C[M, N] (+)= A[M, K]·B[K, N]
// on tiles of at most kAttnTile rows, with the causal shapes of a diagonal tile computed without their discarded
// half. Written with GCC vector extensions: 64-byte vectors in a form compiled for AVX-512 (32 registers hold 8
// rows × 2 vectors of accumulators), picked where the CPU has it, and 32-byte vectors in every level's copy of the
// other form (MOE_CPU_CLONES: x86-64-v4, x86-64-v3, baseline SSE2), whose accumulators stay in 16 registers; the
// micro-kernels are force-inlined into both. Each element sums its k in increasing order in either, one FMA per term,
// so the AVX-512 form gives the bits of the other form's x86-64-v4 copy. Not a general GEMM (kernels/cpu/gemm.h).
#pragma once

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "moecore/core/cpu.h"
#include "moecore/core/tensor.h"
#include "moecore/kernels/attention.h"
#include "moecore/kernels/cpu/vec_math.h"

// Vector values only pass between force-inlined functions inside one level's copy: no ABI boundary is crossed.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace moecore::kernels::flash {

// Which part of a diagonal tile's product is needed (local row i of C is query/key i of the tile):
//   Full:       everything.
//   ColsUpToRow: row i needs columns j ≤ i only (scores of a diagonal tile): columns past the row block's last row
//               are skipped in steps of a vector.
//   KUpToRow:   row i sums k ≤ i only (P·V, dS·K of a diagonal tile: the other terms are zero).
//   KFromRow:   row i sums k ≥ i only (Pᵀ·dO, dSᵀ·Q of a diagonal tile).
//   KFromCol:   column j sums k ≥ j only (dOᵀ·P, Qᵀ·dS of a diagonal tile; the bf16 block products only, block_gemm
//               computes it whole).
enum class Causal { Full, ColsUpToRow, KUpToRow, KFromRow, KFromCol };

// Bytes: 32 (the level copies of block_gemm_any) or 64 (the AVX-512 form). Callers pad column counts to Vec<T>::kLanes
// (32 bytes), which either form takes.
template <typename T, int Bytes = 32>
struct Vec {
  typedef T type __attribute__((vector_size(Bytes)));
  static constexpr int kLanes = Bytes / sizeof(T);
};

template <typename V, typename T>
MOE_ALWAYS_INLINE V load_vec(const T* p) {
  V v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
template <typename T, typename V>
MOE_ALWAYS_INLINE void store_vec(T* p, V v) {
  std::memcpy(p, &v, sizeof v);
}

// Operand A: element (i, k) at a[i·rs + k·cs] (either stride may be 1: a row-major tile or a transposed one).
template <typename T>
struct MatA {
  const T* a;
  int64_t rs, cs;
  MOE_ALWAYS_INLINE T at(int64_t i, int64_t k) const { return a[i * rs + k * cs]; }
};
// Operand B and C: row r at p + r·ld, contiguous columns.
template <typename T>
struct MatB {
  const T* p;
  int64_t ld;
};
template <typename T>
struct MatC {
  T* p;
  int64_t ld;
};

// MR rows × NV vectors of C over k in [k0, k1): the accumulators stay in registers across the whole reduction.
template <typename T, int MR, int NV, int Bytes>
MOE_ALWAYS_INLINE void micro(int64_t k0, int64_t k1, MatA<T> a, int64_t i0, MatB<T> b, int64_t j0, MatC<T> c,
                             bool accumulate) {
  using V = typename Vec<T, Bytes>::type;
  constexpr int L = Vec<T, Bytes>::kLanes;
  V acc[MR][NV];
#pragma GCC unroll 8
  for (int i = 0; i < MR; i++)
#pragma GCC unroll 4
    for (int v = 0; v < NV; v++) acc[i][v] = accumulate ? load_vec<V>(c.p + (i0 + i) * c.ld + j0 + v * L) : V{};
  for (int64_t k = k0; k < k1; k++) {
    const T* bk = b.p + k * b.ld + j0;
    V bv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; v++) bv[v] = load_vec<V>(bk + v * L);
#pragma GCC unroll 8
    for (int i = 0; i < MR; i++) {
      const T ai = a.at(i0 + i, k);
#pragma GCC unroll 4
      for (int v = 0; v < NV; v++) acc[i][v] += ai * bv[v];
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; i++)
#pragma GCC unroll 4
    for (int v = 0; v < NV; v++) store_vec(c.p + (i0 + i) * c.ld + j0 + v * L, acc[i][v]);
}

// Columns [j0, j1) of rows [i0, i0+mr) where fewer than a vector remain: plain loops, in the same k order.
template <typename T>
MOE_ALWAYS_INLINE void tail(int64_t k0, int64_t k1, MatA<T> a, int64_t i0, int64_t mr, MatB<T> b, int64_t j0,
                            int64_t j1, MatC<T> c, bool accumulate) {
  for (int64_t i = i0; i < i0 + mr; i++)
    for (int64_t j = j0; j < j1; j++) {
      T s = accumulate ? c.p[i * c.ld + j] : T(0);
      for (int64_t k = k0; k < k1; k++) s += a.at(i, k) * b.p[k * b.ld + j];
      c.p[i * c.ld + j] = s;
    }
}

// One block of MR rows: columns in steps of 2 vectors, then 1, then the scalar tail.
template <typename T, int MR, int Bytes>
MOE_ALWAYS_INLINE void row_block(int64_t k0, int64_t k1, MatA<T> a, int64_t i0, MatB<T> b, int64_t n, MatC<T> c,
                                 bool accumulate) {
  constexpr int L = Vec<T, Bytes>::kLanes;
  int64_t j = 0;
  for (; j + 2 * L <= n; j += 2 * L) micro<T, MR, 2, Bytes>(k0, k1, a, i0, b, j, c, accumulate);
  for (; j + L <= n; j += L) micro<T, MR, 1, Bytes>(k0, k1, a, i0, b, j, c, accumulate);
  if (j < n) tail(k0, k1, a, i0, MR, b, j, n, c, accumulate);
}

// The last rows of a product (fewer than a register block's): row_block of exactly `rest` rows.
template <typename T, int R, int Bytes>
MOE_ALWAYS_INLINE void rest_rows(int64_t rest, int64_t k0, int64_t k1, MatA<T> a, int64_t i0, MatB<T> b, int64_t n,
                                 MatC<T> c, bool accumulate) {
  if constexpr (R > 0) {
    if (rest == R)
      row_block<T, R, Bytes>(k0, k1, a, i0, b, n, c, accumulate);
    else
      rest_rows<T, R - 1, Bytes>(rest, k0, k1, a, i0, b, n, c, accumulate);
  }
}

// C[M, N] (+)= A[M, K]·B[K, N] with the causal restriction `mode` (see Causal), MR rows × 2 vectors of Bytes at a time.
// With ColsUpToRow the columns a row block skips are not written (the caller treats them as masked). Each element's
// sum runs over k in increasing order whatever the blocking, so results do not depend on thread count, tile position
// or vector width.
template <typename T, int MR, int Bytes>
MOE_ALWAYS_INLINE void block_gemm_rows(int64_t M, int64_t N, int64_t K, MatA<T> a, MatB<T> b, MatC<T> c,
                                       bool accumulate, Causal mode) {
  constexpr int L = Vec<T, Bytes>::kLanes;
  int64_t i0 = 0;
  auto range = [&](int64_t rows, int64_t& k0, int64_t& k1, int64_t& n) {
    k0 = 0, k1 = K, n = N;
    if (mode == Causal::ColsUpToRow) n = std::min(N, (i0 + rows + L - 1) / L * L);
    if (mode == Causal::KUpToRow) k1 = std::min(K, i0 + rows);
    if (mode == Causal::KFromRow) k0 = std::min(K, i0);
  };
  int64_t k0, k1, n;
  for (; i0 + MR <= M; i0 += MR) {
    range(MR, k0, k1, n);
    row_block<T, MR, Bytes>(k0, k1, a, i0, b, n, c, accumulate);
  }
  range(M - i0, k0, k1, n);
  rest_rows<T, MR - 1, Bytes>(M - i0, k0, k1, a, i0, b, n, c, accumulate);
}

// 6 rows × 2 vectors of 32 bytes = 12 accumulators (of 16 AVX2 registers), compiled for each level (MOE_CPU_CLONES).
template <typename T>
__attribute__((noinline)) void block_gemm_any(int64_t M, int64_t N, int64_t K, MatA<T> a, MatB<T> b, MatC<T> c,
                                              bool accumulate, Causal mode) {
  MOE_CPU_CLONES(block_gemm_rows<T, 6, 32>(M, N, K, a, b, c, accumulate, mode));
}

// 8 rows × 2 vectors of 64 bytes = 16 accumulators (of 32 AVX-512 registers).
template <typename T>
__attribute__((noinline, target("avx2,fma,avx512f,avx512vl,avx512bw,avx512dq"))) void block_gemm_avx512(
    int64_t M, int64_t N, int64_t K, MatA<T> a, MatB<T> b, MatC<T> c, bool accumulate, Causal mode) {
  block_gemm_rows<T, 8, 64>(M, N, K, a, b, c, accumulate, mode);
}

inline bool block_gemm_has_avx512() {
  static const bool yes = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
                          __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
                          cpu_isa_allowed(CpuIsa::Avx512);
  return yes;
}

// The product as block_gemm_rows says, in the AVX-512 form where the CPU has it: one out-of-line call per tile
// product.
template <typename T>
inline void block_gemm(int64_t M, int64_t N, int64_t K, MatA<T> a, MatB<T> b, MatC<T> c, bool accumulate,
                       Causal mode = Causal::Full) {
  if (block_gemm_has_avx512())
    block_gemm_avx512<T>(M, N, K, a, b, c, accumulate, mode);
  else
    block_gemm_any<T>(M, N, K, a, b, c, accumulate, mode);
}

// Rows of the head pair bn = b·N + n of a [S, B, N, D] tensor (head = D, ld = B·N·D) or of a packed
// [B·N, S, D] copy (head = S·D, ld = D).
template <typename T>
struct Heads {
  const T* p;
  int64_t head, ld;
  const T* at(int64_t bn, int64_t s) const { return p + bn * head + s * ld; }
};
template <typename T>
Heads<T> heads_of(const T* p, const AttentionDims& d, int64_t N) {
  return {p, d.D, d.B * N * d.D};
}

// Per-thread scratch: `per_thread` elements each, rounded up to whole cache lines so that threads share none.
template <typename T>
struct Scratch {
  Tensor t;
  int64_t per_thread;
  Scratch(int64_t n, DType dt) : per_thread((n + 15) / 16 * 16) { t = Tensor::empty({num_threads(), per_thread}, dt); }
  T* mine() { return t.data<T>() + omp_get_thread_num() * per_thread; }
};

// The fused backward does 5 block products per tile pair, the two-pass one 7 (in both flash kernels); fused wins unless
// its (b, kv head) items leave threads idle for more than 2/7 of the time.
inline bool use_fused(const AttentionDims& d) {
  const int64_t items = d.B * d.Nkv, threads = num_threads();
  const int64_t rounds = (items + threads - 1) / threads;
  return 7 * items >= 5 * rounds * threads;
}

// Per-thread buffers of one backward item (a key tile against its query tiles): the score and dP/dS tiles, the dK
// and dV accumulators, the query, output-gradient and key rows of the current tile pair, and a row of zeros.
template <typename T>
struct BackwardTiles {
  T *sc, *dp, *dK, *dV, *q, *dout, *k, *z;
  explicit BackwardTiles(T* s, int64_t D)
      : sc(s),
        dp(s + kAttnTile * kAttnTile),
        dK(dp + kAttnTile * kAttnTile),
        dV(dK + kAttnTile * D),
        q(dV + kAttnTile * D),
        dout(q + kAttnTile * D),
        k(dout + kAttnTile * D),
        z(k + kAttnTile * D) {}
  static int64_t size(int64_t D) { return 2 * kAttnTile * kAttnTile + 5 * kAttnTile * D + kAttnTile; }
};

// One query row of a score tile in the online softmax: s[0, jmax) ← exp(s − m') with m' the new running maximum, then
// times the row's dropout multipliers when `drop` gives them (drop(z) fills z[0, jmax)); the running sum l and
// maximum m updated. Returns exp(m − m'), the factor the row's output accumulated so far is rescaled by. The flash
// kernel's, in f32 and f64 (the native-bf16 kernel has its own in 16-lane vectors, attention_native_softmax.h).
template <typename T, typename Drop>
MOE_ALWAYS_INLINE T online_softmax_row(T* s, int64_t jmax, T& m, T& l, T* z, Drop drop) {
  T mx = m;
#pragma omp simd reduction(max : mx)
  for (int64_t j = 0; j < jmax; j++) mx = s[j] > mx ? s[j] : mx;
  const T alpha = std::exp(m - mx);
  T sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < jmax; j++) {
    s[j] = vexp(s[j] - mx);
    sum += s[j];
  }
  l = l * alpha + sum;
  m = mx;
  if (drop(z)) {
#pragma omp simd
    for (int64_t j = 0; j < jmax; j++) s[j] *= z[j];
  }
  return alpha;
}

// One query row of the backward's recomputed tile, columns [0, jmax): P = exp(mul·s − lse) and dS = P·(dP − Δ),
// with the row's dropout multipliers z (when given) on P and dP, each stored through cvt (the kernel's rounding or
// storage type) into p_out and ds_out, which may be s and g themselves. The flash kernel's (the native-bf16 kernel's
// is native_softmax_backward_row).
template <typename T, typename O, typename Cvt>
MOE_ALWAYS_INLINE void softmax_backward_row(const T* s, const T* g, T mul, T lse, T delta, const T* z, int64_t jmax,
                                            O* p_out, O* ds_out, Cvt cvt) {
  if (z) {
#pragma omp simd
    for (int64_t j = 0; j < jmax; j++) {
      const T p = vexp(s[j] * mul - lse);
      p_out[j] = cvt(p * z[j]);
      ds_out[j] = cvt(p * (g[j] * z[j] - delta));
    }
  } else {
#pragma omp simd
    for (int64_t j = 0; j < jmax; j++) {
      const T p = vexp(s[j] * mul - lse);
      p_out[j] = cvt(p);
      ds_out[j] = cvt(p * (g[j] - delta));
    }
  }
}

}  // namespace moecore::kernels::flash
