// The native-bf16 flash attention's softmax on one query row of a score tile (kTn = 64 keys), forward and backward, in
// 16-lane vectors: the running maximum and sum of the online softmax (attention_blocks.h's online_softmax_row, whose
// formulas hold here) with their horizontal reductions as fixed trees of vector permutes, and the row's probabilities
// written straight into the bf16 P row the next block product reads. online_softmax_row's `omp simd` reductions end in
// a chain of 16 dependent scalar operations per row and key tile; here they are 4 permutes deep. Internal to the native
// kernels (attention_flash_native.cpp, attention_flash_native_block.cpp), which include it in their target clones.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "moecore/core/cpu.h"
#include "moecore/core/dtype.h"
#include "moecore/kernels/cpu/attention.h"

// Vector values only pass between force-inlined functions inside one target clone: no ABI boundary is crossed.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace moecore::kernels::flash {
namespace {

typedef float Floats16 __attribute__((vector_size(64)));
typedef int32_t Ints16 __attribute__((vector_size(64)));
typedef uint32_t Uints16 __attribute__((vector_size(64)));
typedef uint16_t Halves16 __attribute__((vector_size(32)));

static_assert(kAttnTile == 64, "the row functions below take a score row as four vectors");
constexpr int kRowVecs = 4;

MOE_ALWAYS_INLINE Floats16 splat(float x) {
  return Floats16{} + x;
}

// Lanes j0 + 0..15 below n: all ones where visible.
MOE_ALWAYS_INLINE Ints16 lanes_below(int64_t j0, int64_t n) {
  const Ints16 lane = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  return lane < static_cast<int32_t>(std::min<int64_t>(n - j0, 16));
}

// vexp (vec_math.h) on 16 lanes: the same operations, the same bits.
MOE_ALWAYS_INLINE Floats16 vexp16(Floats16 x) {
  x = x < -87.0f ? splat(-87.0f) : (x > 88.0f ? splat(88.0f) : x);
  const Floats16 n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  const Floats16 r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
  Floats16 p = splat(1.0f / 5040);
  p = p * r + 1.0f / 720;
  p = p * r + 1.0f / 120;
  p = p * r + 1.0f / 24;
  p = p * r + 1.0f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const Ints16 e = (__builtin_convertvector(n == n ? n : splat(0.0f), Ints16) + 127) << 23;
  return p * std::bit_cast<Floats16>(e);
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

// A row's attention dropout as the rows below take it: the keep bits of its keys (AttentionDropout::row_bits) and the
// multiplier of a kept probability (AttentionDropout::keep).
struct RowDrop {
  uint64_t bits;
  float keep;
};

// Query row i's dropout over keys [j0, j0 + n) of a head whose mask is `head` (AttentionDropout::head_mask), into rd:
// &rd, or null without dropout or visible keys.
MOE_ALWAYS_INLINE const RowDrop* row_drop(const AttentionDropout* d, const DropoutMask& head, int64_t b, int64_t i,
                                          int64_t j0, int64_t n, RowDrop& rd) {
  if (!d || n <= 0) return nullptr;
  rd = {d->row_bits(head, b, i, j0, n), d->keep()};
  return &rd;
}

// The multipliers of lanes 16v + 0..15: keep where the bit is set, else 0 (multiplied, as the multipliers were, so
// that a NaN or infinity stays one).
MOE_ALWAYS_INLINE Floats16 drop_multipliers(const RowDrop& d, int v) {
  const Ints16 lane = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  const Ints16 word = Ints16{} + static_cast<int32_t>((d.bits >> (16 * v)) & 0xFFFF);
  return ((word >> lane) & 1) != 0 ? splat(d.keep) : splat(0.0f);
}

// One query row of a score tile in the online softmax, keys [0, jmax) of s visible (the rest of s's kTn may hold
// anything): p[0, kTn) ← bf16(exp(s − m') ⊙ Z) over the visible keys and 0 past them, with m' the new running
// maximum and Z the row's dropout multipliers when `drop` is given; the running sum l (of exp(s − m'), before
// dropout) and maximum m updated. Returns exp(m − m'), the factor the row's output so far is rescaled by.
MOE_ALWAYS_INLINE float native_softmax_row(const float* s, int64_t jmax, float& m, float& l, const RowDrop* drop,
                                           bf16* p) {
  Floats16 x[kRowVecs];
  Ints16 vis[kRowVecs];
  const float inf = std::numeric_limits<float>::infinity();
  Floats16 mx = splat(m);
  for (int v = 0; v < kRowVecs; v++) {
    std::memcpy(&x[v], s + 16 * v, sizeof(Floats16));
    vis[v] = lanes_below(16 * v, jmax);
    const Floats16 xv = vis[v] ? x[v] : splat(-inf);
    mx = xv > mx ? xv : mx;
  }
  const float mn = lanes_max(mx);
  const float alpha = std::exp(m - mn);
  Floats16 sum{};
  for (int v = 0; v < kRowVecs; v++) {
    x[v] = vis[v] ? vexp16(x[v] - mn) : splat(0.0f);
    sum += x[v];
  }
  l = l * alpha + lanes_sum(sum);
  m = mn;
  for (int v = 0; v < kRowVecs; v++) {
    if (drop) x[v] *= drop_multipliers(*drop, v);
    const Halves16 h = to_bf16_lanes(x[v]);
    std::memcpy(p + 16 * v, &h, sizeof h);
  }
  return alpha;
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
