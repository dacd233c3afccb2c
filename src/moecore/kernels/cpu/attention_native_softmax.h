// The native-bf16 flash attention's softmax on the query rows of a score tile (kTn = 64 keys), forward and backward, in
// 16-lane vectors: the running maximum and sum of the online softmax (attention_blocks.h's online_softmax_row, whose
// formulas hold here) with their horizontal reductions as fixed trees of vector permutes, and the rows' probabilities
// written straight into the bf16 P rows the next block product reads. online_softmax_row's `omp simd` reductions end
// in a chain of 16 dependent scalar operations per row and key tile; here they are 4 permutes deep, and two rows go
// together. Dropout enters as keep bits (AttentionDropout::rows_bits). Internal to the native kernels
// (attention_flash_native.cpp, attention_flash_native_block.cpp), which inline it into each level's copy of their
// loops (MOE_CPU_CLONES).
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "moecore/core/cpu.h"
#include "moecore/core/dtype.h"
#include "moecore/kernels/attention.h"
#include "moecore/kernels/cpu/vec_math.h"

// Vector values only pass between force-inlined functions inside one level's copy: no ABI boundary is crossed.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace moecore::kernels::flash {
namespace {

typedef float Floats16 __attribute__((vector_size(64)));
typedef int32_t Ints16 __attribute__((vector_size(64)));
typedef uint32_t Uints16 __attribute__((vector_size(64)));
typedef uint16_t Halves16 __attribute__((vector_size(32)));

static_assert(kAttnTile == 64, "the row functions below take a score row as four vectors");
constexpr int kRowVecs = 4;
constexpr int kTileRowsMax = 2;  // query rows whose softmax (and dropout bits) go together

MOE_ALWAYS_INLINE Floats16 splat(float x) {
  return Floats16{} + x;
}

// Lanes j0 + 0..15 below n: all ones where visible.
MOE_ALWAYS_INLINE Ints16 lanes_below(int64_t j0, int64_t n) {
  const Ints16 lane = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  return lane < static_cast<int32_t>(std::min<int64_t>(n - j0, 16));
}

// vexp (vec_math.h) on 16 lanes; its conversions inlined too, or the baseline copy's would take and return 64-byte
// vectors through the SSE ABI.
MOE_ALWAYS_INLINE Floats16 vexp16(Floats16 x) {
  return vexp_f32(
      x, [](Floats16 n) __attribute__((always_inline)) { return __builtin_convertvector(n, Ints16); },
      [](Ints16 e) __attribute__((always_inline)) { return std::bit_cast<Floats16>(e); });
}

// The maximum and sum of 16 lanes in a fixed tree: halves, quarters, eighths, pairs.
MOE_ALWAYS_INLINE float lanes_max(Floats16 v) {
  v = v > __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7)
          ? v
          : __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7);
  const Floats16 q = __builtin_shufflevector(v, v, 4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11);
  v = v > q ? v : q;
  const Floats16 e = __builtin_shufflevector(v, v, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13);
  v = v > e ? v : e;
  return v[0] > v[1] ? v[0] : v[1];
}
MOE_ALWAYS_INLINE float lanes_sum(Floats16 v) {
  v += __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7);
  v += __builtin_shufflevector(v, v, 4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11);
  v += __builtin_shufflevector(v, v, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13);
  return v[0] + v[1];
}

// float_to_bf16 (dtype.h) on 16 lanes.
MOE_ALWAYS_INLINE Halves16 to_bf16_lanes(Floats16 x) {
  const Uints16 u = std::bit_cast<Uints16>(x);
  const Uints16 rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  const Uints16 nan = (u >> 16) | 0x40u;
  return __builtin_convertvector((u & 0x7FFFFFFFu) > 0x7F800000u ? nan : rounded, Halves16);
}

// A row's attention dropout as the rows below take it: the keep bits of its keys (AttentionDropout::rows_bits) and the
// multiplier of a kept probability (AttentionDropout::keep).
struct RowDrop {
  uint64_t bits;
  float keep;
};

// The dropout of query rows i .. i + rows − 1 of a head whose mask is `head` (AttentionDropout::head_mask) over a
// tile's keys [j0, j0 + nc), into rd[0, rows); drop[r] ← &rd[r], or null without dropout. Bits past a row's visible
// keys are drawn but never read.
MOE_ALWAYS_INLINE void tile_rows_drop(const AttentionDropout* d, const DropoutMask& head, int64_t b, int64_t i,
                                      int rows, int64_t j0, int64_t nc, RowDrop* rd, const RowDrop** drop) {
  if (!d) {
    std::fill(drop, drop + rows, nullptr);
    return;
  }
  uint64_t bits[kTileRowsMax];
  d->rows_bits(head, b, i, rows, j0, nc, bits);
  const float keep = d->keep();
  for (int r = 0; r < rows; r++) {
    rd[r] = {bits[r], keep};
    drop[r] = &rd[r];
  }
}

// f(i, drop) for the query rows i in [0, nr) of a tile (rows i0 + i, keys [j0, j0 + nc)), kTileRowsMax at a time
// whose dropout bits are drawn together (tile_rows_drop); drop: the row's RowDrop, or null.
template <class F>
MOE_ALWAYS_INLINE void for_tile_rows(const AttentionDropout* d, const DropoutMask& head, int64_t b, int64_t i0,
                                     int64_t nr, int64_t j0, int64_t nc, F f) {
  for (int64_t i = 0; i < nr; i += kTileRowsMax) {
    const int rows = static_cast<int>(std::min<int64_t>(kTileRowsMax, nr - i));
    RowDrop rd[kTileRowsMax];
    const RowDrop* drop[kTileRowsMax];
    tile_rows_drop(d, head, b, i0 + i, rows, j0, nc, rd, drop);
    for (int r = 0; r < rows; r++) f(i + r, drop[r]);
  }
}

// The multipliers of lanes 16v + 0..15: keep where the bit is set, else 0 (multiplied, as the multipliers were, so
// that a NaN or infinity stays one).
MOE_ALWAYS_INLINE Floats16 drop_multipliers(const RowDrop& d, int v) {
  const Ints16 lane = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  const Ints16 word = Ints16{} + static_cast<int32_t>((d.bits >> (16 * v)) & 0xFFFF);
  return ((word >> lane) & 1) != 0 ? splat(d.keep) : splat(0.0f);
}

// R query rows of a score tile in the online softmax (row r at s + r·kTn, keys [0, jmax[r]) visible, the rest of
// the row may hold anything), their operations interleaved so that the rows' dependency chains (a maximum, the
// exponentials, a sum) overlap: p[r·kTn, (r + 1)·kTn) ← bf16(exp(s − m') ⊙ Z) over the visible keys and 0 past them,
// with m' the row's new running maximum and Z its dropout multipliers when drop[r] is given; the running sum l[r]
// (of exp(s − m'), before dropout) and maximum m[r] updated; alpha[r] ← exp(m − m'), the factor the row's output so
// far is rescaled by. Each row's values do not depend on R.
template <int R>
MOE_ALWAYS_INLINE void native_softmax_rows(const float* s, const int64_t* jmax, float* m, float* l,
                                           const RowDrop* const* drop, bf16* p, float* alpha) {
  Floats16 x[R][kRowVecs];
  Ints16 vis[R][kRowVecs];
  Floats16 mx[R], sum[R];
  const float inf = std::numeric_limits<float>::infinity();
  for (int r = 0; r < R; r++) mx[r] = splat(m[r]);
  for (int v = 0; v < kRowVecs; v++)
    for (int r = 0; r < R; r++) {
      std::memcpy(&x[r][v], s + r * kTn + 16 * v, sizeof(Floats16));
      vis[r][v] = lanes_below(16 * v, jmax[r]);
      const Floats16 xv = vis[r][v] ? x[r][v] : splat(-inf);
      mx[r] = xv > mx[r] ? xv : mx[r];
    }
  float mn[R];
  for (int r = 0; r < R; r++) {
    mn[r] = lanes_max(mx[r]);
    alpha[r] = std::exp(m[r] - mn[r]);
    sum[r] = Floats16{};
  }
  for (int v = 0; v < kRowVecs; v++)
    for (int r = 0; r < R; r++) {
      x[r][v] = vis[r][v] ? vexp16(x[r][v] - mn[r]) : splat(0.0f);
      sum[r] += x[r][v];
    }
  for (int r = 0; r < R; r++) {
    l[r] = l[r] * alpha[r] + lanes_sum(sum[r]);
    m[r] = mn[r];
  }
  for (int v = 0; v < kRowVecs; v++)
    for (int r = 0; r < R; r++) {
      if (drop[r]) x[r][v] *= drop_multipliers(*drop[r], v);
      const Halves16 h = to_bf16_lanes(x[r][v]);
      std::memcpy(p + r * kTn + 16 * v, &h, sizeof h);
    }
}

// One query row of the backward's recomputed tile (softmax_backward_row of attention_blocks.h with Q̂ carrying the
// scale): over the visible keys [0, jmax), P = exp(s − lse) and dS = P ⊙ (dP ⊙ Z − Δ), P stored as bf16(P ⊙ Z) (Z the
// row's dropout multipliers when `drop` is given); p and ds hold kTn bf16 each, zero past jmax.
MOE_ALWAYS_INLINE void native_softmax_backward_row(const float* s, const float* g, float lse, float delta,
                                                   const RowDrop* drop, int64_t jmax, bf16* p, bf16* ds) {
  for (int v = 0; v < kRowVecs; v++) {
    Floats16 sv, gv;
    std::memcpy(&sv, s + 16 * v, sizeof sv);
    std::memcpy(&gv, g + 16 * v, sizeof gv);
    const Ints16 vis = lanes_below(16 * v, jmax);
    const Floats16 e = vexp16(sv - lse);
    Floats16 pv = e;
    if (drop) {
      const Floats16 z = drop_multipliers(*drop, v);
      pv = e * z;
      gv = gv * z;
    }
    const Halves16 ph = to_bf16_lanes(vis ? pv : splat(0.0f)), dh = to_bf16_lanes(vis ? e * (gv - delta) : splat(0.0f));
    std::memcpy(p + 16 * v, &ph, sizeof ph);
    std::memcpy(ds + 16 * v, &dh, sizeof dh);
  }
}

}  // namespace
}  // namespace moecore::kernels::flash
