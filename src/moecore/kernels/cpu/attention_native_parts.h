// The parts of the native-bf16 flash attention kernel that its whole-sequence form (attention_flash_native.cpp) and
// its block form for context parallelism (attention_flash_native_block.cpp) share: the tile layouts and packing of
// operands (f32 or bf16 rows, RoPE on the way in or out), per-thread backward tiles, Δ, and the backend switch.
// Internal to those two files (internal linkage: each includes its own copy).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "moecore/kernels/cpu/amx_tiles.h"
#include "moecore/kernels/cpu/attention_flash_native.h"
#include "moecore/kernels/cpu/vec_math.h"
#include "moecore/kernels/rope.h"

namespace moecore::kernels::flash {
namespace {

constexpr int64_t kTn = kAttnTile;  // queries or keys per tile

// A call's sizes with the padded head width and sequence; every packed tile holds kTn × Dp bf16.
struct NativeDims {
  AttentionDims d;
  int64_t Dp, nt, Sp;
  explicit NativeDims(const AttentionDims& a) : d(a), Dp(round_up(a.D, 32)), nt(a.ntiles()), Sp(a.ntiles() * kTn) {}
  int64_t tile() const { return kTn * Dp; }
};

// How a tile of rows s (kTn of them) × width e (Dp) is packed:
//   Rows:     (s, e) at [s·Dp + e]                     — an A operand with k = e (Q̂, dÔ).
//   EPairs:   (s, e) at [(e/2)·2Tn + 2s + e%2]         — a B operand with k = e, n = s (K̂ᵀ, V̂ᵀ).
//   RowPairs: (s, e) at [(s/2)·2Dp + 2e + s%2]         — a B operand with k = s, n = e (V̂, K̂).
//   Cols:     (s, e) at [e·Tn + s]                     — an A operand with k = s (Q̂ᵀ, dÔᵀ).
enum class NativePack { Rows, EPairs, RowPairs, Cols };

// 16 words (32 bits) as one vector, for the transposes below (the compiler picks each ISA's permutes).
typedef uint32_t Words16 __attribute__((vector_size(64)));

// Word j of the two rows a, b of a 2K-row block after they swap their off-diagonal K × K blocks: a keeps its
// words j with j & K clear and takes b's words j − K in the others (index 16 + j − K: b's), b the reverse.
template <int K, int... J>
MOE_ALWAYS_INLINE Words16 swap_low(Words16 a, Words16 b, std::integer_sequence<int, J...>) {
  return __builtin_shufflevector(a, b, ((J & K) == 0 ? J : 16 + J - K)...);
}
template <int K, int... J>
MOE_ALWAYS_INLINE Words16 swap_high(Words16 a, Words16 b, std::integer_sequence<int, J...>) {
  return __builtin_shufflevector(a, b, ((J & K) == 0 ? J + K : 16 + J)...);
}

// Rows i and i + K of every 2K-row block of r swap their off-diagonal K × K blocks; the four stages K = 8, 4, 2, 1
// transpose the 16 × 16 words of r.
template <int K>
MOE_ALWAYS_INLINE void swap_blocks(Words16 (&r)[16]) {
  static_assert(K == 8 || K == 4 || K == 2 || K == 1);
  constexpr auto words = std::make_integer_sequence<int, 16>{};
  for (int i = 0; i < 16; i++)
    if ((i & K) == 0) {
      const Words16 a = r[i], b = r[i + K];
      r[i] = swap_low<K>(a, b, words);
      r[i + K] = swap_high<K>(a, b, words);
    }
}

// out[c·out_ld + s] ← in[s·ld + c] for `rows` rows s (a multiple of 16) and 16 columns c of 32-bit words, 16 × 16
// blocks at a time.
MOE_ALWAYS_INLINE void transpose_words(const void* in, int64_t ld, void* out, int64_t rows = kTn,
                                       int64_t out_ld = kTn) {
  const auto* src = static_cast<const char*>(in);
  auto* dst = static_cast<char*>(out);
  for (int64_t s0 = 0; s0 < rows; s0 += 16) {
    Words16 r[16];
    for (int i = 0; i < 16; i++) std::memcpy(&r[i], src + (s0 + i) * ld * 4, sizeof(Words16));
    swap_blocks<8>(r);
    swap_blocks<4>(r);
    swap_blocks<2>(r);
    swap_blocks<1>(r);
    for (int c = 0; c < 16; c++) std::memcpy(dst + (c * out_ld + s0) * 4, &r[c], sizeof(Words16));
  }
}

// Columns [e0, e0+32) of a tile's rounded rows (buf [kTn, Dp]) into the tile's layout P. EPairs is a transpose of
// 32-bit words (the pairs (e, e + 1) of each row); Cols splits each transposed word into its two halves.
template <NativePack P>
MOE_ALWAYS_INLINE void emit_tile_cols(const uint16_t* buf, int64_t Dp, int64_t e0, uint16_t* out) {
  if constexpr (P == NativePack::Rows)
    for (int64_t s = 0; s < kTn; s++) std::memcpy(out + s * Dp + e0, buf + s * Dp + e0, 64);
  if constexpr (P == NativePack::RowPairs)
    for (int64_t p = 0; p < kTn / 2; p++) {
      uint32_t pairs[32];
      const uint16_t *r0 = buf + 2 * p * Dp + e0, *r1 = r0 + Dp;
#pragma omp simd
      for (int64_t e = 0; e < 32; e++) pairs[e] = uint32_t(r0[e]) | uint32_t(r1[e]) << 16;
      std::memcpy(out + p * 2 * Dp + 2 * e0, pairs, sizeof pairs);
    }
  // A word of buf is (e, e + 1) of a row, little-endian: e in its low half.
  const auto* words = reinterpret_cast<const uint32_t*>(buf + e0);
  if constexpr (P == NativePack::EPairs)
    transpose_words(words, Dp / 2, reinterpret_cast<uint32_t*>(out) + e0 / 2 * kTn);
  if constexpr (P == NativePack::Cols) {
    alignas(64) uint32_t pairs[16 * kTn];
    transpose_words(words, Dp / 2, pairs);
    for (int64_t ep = 0; ep < 16; ep++) {
      uint16_t *even = out + (e0 + 2 * ep) * kTn, *odd = even + kTn;
      const uint32_t* w = pairs + ep * kTn;
#pragma omp simd
      for (int64_t s = 0; s < kTn; s++) {
        even[s] = static_cast<uint16_t>(w[s]);
        odd[s] = static_cast<uint16_t>(w[s] >> 16);
      }
    }
  }
}

// A tensor's rows by (head pair, position) in f32 or bf16: the kernel's inputs and outputs.
struct NativeRows {
  char* p;
  bool bf16;
  int64_t head, ld, rows;  // in elements; rows: positions
  NativeRows(const Tensor& t, const AttentionDims& d, int64_t N)
      : p(static_cast<char*>(t.raw())), bf16(t.dtype() == DType::BF16), head(d.D), ld(d.B * N * d.D), rows(t.dim(0)) {
    MOE_ASSERT_MSG(t.dtype() == DType::F32 || bf16, "bf16 attention takes f32 or bf16 tensors, got {}",
                   dtype_name(t.dtype()));
  }
  void* at(int64_t bn, int64_t s) const { return p + (bn * head + s * ld) * (bf16 ? 2 : 4); }
};

// A head's consecutive rows are a whole token row apart (B·N·D elements), a stride the hardware prefetchers miss
// (bench attention at bench train's shape, bf16: +18% with this): the loops that read or write a head's rows one
// after another ask, at row s, for row s + kRowsAhead of bn when there is one.
constexpr int64_t kRowsAhead = 8;
MOE_ALWAYS_INLINE void prefetch_ahead(const NativeRows& r, int64_t bn, int64_t s, bool write) {
  if (s + kRowsAhead >= r.rows) return;
  const char* p = static_cast<const char*>(r.at(bn, s + kRowsAhead));
  for (int64_t c = 0; c < r.head * (r.bf16 ? 2 : 4); c += 64) {
    if (write)  // the read/write hint must be a constant
      __builtin_prefetch(p + c, 1);
    else
      __builtin_prefetch(p + c, 0);
  }
}

// RoPE by row position (AttentionRope): pair (i, i + h) of row s turns by cos/sin row s, sign −1 transposed.
struct NativeRope {
  const float *cos, *sin;
  int64_t h;
};

// y ← x turned by RoPE at position pos (sign −1: transposed), through rope_forward's own row function (rope.h), so
// with its bits.
MOE_ALWAYS_INLINE void rope_row(const float* x, const NativeRope& r, int64_t pos, float sign, int64_t D, float* y) {
  rope_row_f32(x, r.cos + pos * r.h, r.sin + pos * r.h, r.h, sign, D, y);
}

// Row s of bn as f32 (tmp: 2·D floats when it is bf16 or turned by RoPE).
MOE_ALWAYS_INLINE const float* row_f32(const NativeRows& src, int64_t bn, int64_t s, int64_t D, const NativeRope* rope,
                                       float* tmp) {
  const float* x = static_cast<const float*>(src.at(bn, s));
  if (src.bf16) {
    const auto* xb = static_cast<const bf16*>(src.at(bn, s));
#pragma omp simd
    for (int64_t e = 0; e < D; e++) tmp[e] = bf16_to_float(xb[e]);
    x = tmp;
  }
  if (!rope) return x;
  rope_row(x, *rope, s, 1.0f, D, tmp + D);
  return tmp + D;
}

// Row s of bn of dst ← Rᵀ(mul · g), g's D values at stride ld, rounded once when dst is bf16 (R: RoPE at s when
// rope, transposed; else the identity). tmp: 2·D floats.
MOE_ALWAYS_INLINE void store_row(const float* g, int64_t ld, float mul, const NativeRope* rope, const NativeRows& dst,
                                 int64_t bn, int64_t s, int64_t D, float* tmp) {
  prefetch_ahead(dst, bn, s, true);
  float* y = dst.bf16 || rope ? tmp : static_cast<float*>(dst.at(bn, s));
#pragma omp simd
  for (int64_t e = 0; e < D; e++) y[e] = g[e * ld] * mul;
  if (rope) {
    float* r = dst.bf16 ? tmp + D : static_cast<float*>(dst.at(bn, s));
    rope_row(y, *rope, s, -1.0f, D, r);
    y = r;
  }
  if (!dst.bf16) return;
  auto* out = static_cast<bf16*>(dst.at(bn, s));
#pragma omp simd
  for (int64_t e = 0; e < D; e++) out[e] = float_to_bf16(y[e]);
}

// Rows [j0, j0 + n) of dst ← the columns of an f32 tile summed transposed (t [Dp, kTn]: column j is key j0 + j), with
// RoPE turned back when rope: the tile is transposed 16 × 16 blocks at a time into tmp ([kTn, Dp]) so that each row
// is written from contiguous values. row: 2·Dp floats for store_row.
MOE_ALWAYS_INLINE void store_transposed_tile(const float* t, int64_t Dp, const NativeRope* rope, const NativeRows& dst,
                                             int64_t bn, int64_t j0, int64_t n, int64_t D, float* tmp, float* row) {
  for (int64_t j = 0; j < kTn; j += 16) transpose_words(t + j, kTn, tmp + j * Dp, Dp, Dp);
  for (int64_t j = 0; j < n; j++) store_row(tmp + j * Dp, 1, 1.0f, rope, dst, bn, j0 + j, D, row);
}

// dst [heads, nt, tile] ← bf16(mul · R(src)) in layout P (and into dst2 in layout P2 when given: one read of src for
// both), zero past S and D; R: RoPE by position when rope, else the identity. Each tile's rows are rounded into a
// per-thread buffer (vectorized), then go 32 columns at a time into their layouts.
template <NativePack P, NativePack P2>
MOE_ALWAYS_INLINE void pack_native_body(const NativeDims& n, const NativeRows& src, int64_t heads, float mul,
                                        const NativeRope* rope, bf16* dst, bf16* dst2, Scratch<float>& scratch) {
  const int64_t D = n.d.D, Dp = n.Dp, nt = n.nt;
#pragma omp for schedule(static) collapse(2)
  for (int64_t t = 0; t < nt; t++)
    for (int64_t bn = 0; bn < heads; bn++) {
      auto* buf = reinterpret_cast<uint16_t*>(scratch.mine());
      float* tmp = scratch.mine() + n.tile() / 2;
      for (int64_t s = 0; s < kTn; s++) {
        const int64_t row = t * kTn + s, m = row < n.d.S ? D : 0;
        uint16_t* br = buf + s * Dp;
        prefetch_ahead(src, bn, row, false);
        if (m > 0 && src.bf16 && !rope && mul == 1.0f) {  // bf16(1·x) is x
          std::memcpy(br, src.at(bn, row), static_cast<size_t>(D) * 2);
        } else if (m > 0) {
          const float* in = row_f32(src, bn, row, D, rope, tmp);
#pragma omp simd
          for (int64_t e = 0; e < D; e++) br[e] = float_to_bf16(in[e] * mul).bits;
        }
        std::fill(br + m, br + Dp, uint16_t{0});
      }
      const int64_t off = (bn * nt + t) * n.tile();
      for (int64_t e0 = 0; e0 < Dp; e0 += 32) {
        emit_tile_cols<P>(buf, Dp, e0, &dst[off].bits);
        if (dst2) emit_tile_cols<P2>(buf, Dp, e0, &dst2[off].bits);
      }
    }
}
template <NativePack P, NativePack P2 = P>
void pack_native(const NativeDims& n, const NativeRows& src, int64_t heads, float mul, const NativeRope* rope,
                 bf16* dst, bf16* dst2 = nullptr) {
  Scratch<float> scratch(n.tile() / 2 + 2 * n.d.D, DType::F32);  // the rounded tile, then 2·D floats for row_f32
#pragma omp parallel
  MOE_CPU_CLONES(pack_native_body<P, P2>(n, src, heads, mul, rope, dst, dst2, scratch));
}

// Tile t of head pair bn of a packed buffer.
MOE_ALWAYS_INLINE const bf16* ptile(const bf16* buf, const NativeDims& n, int64_t bn, int64_t t) {
  return buf + (bn * n.nt + t) * n.tile();
}

// dst [kTn/2, kTn] of 32-bit pairs ← rows 2p and 2p+1 of src [kTn, kTn] interleaved: src as a B operand with k = its
// row (query pairs).
MOE_ALWAYS_INLINE void row_pairs(const bf16* src, uint32_t* dst) {
  const uint16_t* s = &src[0].bits;
  for (int64_t p = 0; p < kTn / 2; p++)
#pragma omp simd
    for (int64_t j = 0; j < kTn; j++)
      dst[p * kTn + j] = uint32_t(s[2 * p * kTn + j]) | uint32_t(s[(2 * p + 1) * kTn + j]) << 16;
}

// Per-thread buffers of one forward item: the output rows' f32 sums, scores, softmax statistics, the rounded
// probabilities, and a row for store_row.
struct NativeFwdTiles {
  float *acc, *sc, *m, *l;  // [kTn, Dp], [kTn, kTn], [kTn] ×2
  bf16* P;                  // [kTn, kTn]
  float* row;               // [2·Dp]
  NativeFwdTiles(float* w, int64_t Dp) : acc(w), sc(acc + kTn * Dp), m(sc + kTn * kTn), l(m + kTn) {
    P = reinterpret_cast<bf16*>(l + kTn);
    row = reinterpret_cast<float*>(P + kTn * kTn);
  }
  static int64_t floats(int64_t Dp) { return kTn * Dp + kTn * kTn + 2 * kTn + kTn * kTn / 2 + 2 * Dp; }
};

// Per-thread buffers of one backward item.
struct NativeTiles {
  float *sc, *dp, *dKt, *dVt, *tr;  // [kTn, kTn] ×2, [Dp, kTn] ×2, [kTn, Dp] (store_transposed_tile)
  bf16 *P, *dS;                     // [kTn, kTn] each
  uint32_t *Pp, *dSp;               // [kTn/2, kTn] each: P and dS in query pairs
  float* row;                       // [2·Dp] for store_row
  NativeTiles(float* w, int64_t Dp)
      : sc(w), dp(sc + kTn * kTn), dKt(dp + kTn * kTn), dVt(dKt + kTn * Dp), tr(dVt + kTn * Dp) {
    Pp = reinterpret_cast<uint32_t*>(tr + kTn * Dp);
    dSp = Pp + kTn * kTn / 2;
    P = reinterpret_cast<bf16*>(dSp + kTn * kTn / 2);
    dS = P + kTn * kTn;
    row = reinterpret_cast<float*>(dS + kTn * kTn);
  }
  static int64_t floats(int64_t Dp) { return 2 * kTn * kTn + 3 * kTn * Dp + 4 * kTn * kTn / 2 + 2 * Dp; }
};

// delta [B·Nq, S] ← Δ_i = Σ_d dO_id·O_id per row (f32 values of f32 or bf16 rows, in a fixed vector order).
MOE_ALWAYS_INLINE void native_delta_body(const AttentionDims& d, const NativeRows& dout, const NativeRows& o,
                                         float* delta, Scratch<float>& scratch) {
#pragma omp for schedule(static) collapse(2)
  for (int64_t i = 0; i < d.S; i++)
    for (int64_t r = 0; r < d.B * d.Nq; r++) {
      float* tmp = scratch.mine();
      const float* g = row_f32(dout, r, i, d.D, nullptr, tmp);
      const float* y = row_f32(o, r, i, d.D, nullptr, tmp + 2 * d.D);
      float s = 0;
#pragma omp simd reduction(+ : s)
      for (int64_t e = 0; e < d.D; e++) s += g[e] * y[e];
      delta[r * d.S + i] = s;
    }
}
void native_delta(const AttentionDims& d, const NativeRows& dout, const NativeRows& o, float* delta) {
  Scratch<float> scratch(4 * d.D, DType::F32);
#pragma omp parallel
  MOE_CPU_CLONES(native_delta_body(d, dout, o, delta, scratch));
}

Tensor bf16_buffer(const NativeDims& n, int64_t heads) {
  return Tensor::empty({heads * n.nt * n.tile()}, DType::BF16);
}

// The forward's operands, packed once per call: per query head pair Q̂ = bf16(scale·Q) as rows, per kv head pair K̂ᵀ
// in d pairs and V̂ in key pairs; RoPE on q and k when given.
struct FwdPacks {
  Tensor qR_, kT_, vN_;
  const bf16 *qR, *kT, *vN;
  FwdPacks(const NativeDims& nq, const NativeDims& nk, const NativeRows& q, const NativeRows& k, const NativeRows& v,
           float scale, const NativeRope* rope) {
    const int64_t q_pairs = nq.d.B * nq.d.Nq, kv_pairs = nq.d.B * nq.d.Nkv;
    qR_ = bf16_buffer(nq, q_pairs), kT_ = bf16_buffer(nk, kv_pairs), vN_ = bf16_buffer(nk, kv_pairs);
    pack_native<NativePack::Rows>(nq, q, q_pairs, scale, rope, qR_.data<bf16>());
    pack_native<NativePack::EPairs>(nk, k, kv_pairs, 1.0f, rope, kT_.data<bf16>());
    pack_native<NativePack::RowPairs>(nk, v, kv_pairs, 1.0f, nullptr, vN_.data<bf16>());
    qR = qR_.data<bf16>(), kT = kT_.data<bf16>(), vN = vN_.data<bf16>();
  }
};

// A forward call's arguments for the items loop: its sizes (NativeDims for a whole sequence, the block kernel's own
// for a CP block), packed operands, output rows, lse and dropout.
template <class Dims>
struct FwdCall {
  Dims n;
  const FwdPacks* pk;
  NativeRows o;
  float* lse;
  const AttentionDropout* drop;
};

// The backward's operands, packed once per call (bf16_buffer, pack_native): per query head pair Q̂ = bf16(scale·Q)
// and dÔ as rows and transposed, per kv head pair K̂ᵀ and V̂ᵀ in d pairs and K̂ in key pairs; RoPE on q and k when
// given. nq, nk: the tiles of q-shaped and k-shaped tensors (one NativeDims for a whole sequence).
struct BwdPacks {
  Tensor qR_, qT_, dR_, dT_, kT_, vT_, kN_;
  const bf16 *qR, *qT, *dR, *dT, *kT, *vT, *kN;
  BwdPacks(const NativeDims& nq, const NativeDims& nk, const NativeRows& q, const NativeRows& dout, const NativeRows& k,
           const NativeRows& v, float scale, const NativeRope* rope) {
    const int64_t q_pairs = nq.d.B * nq.d.Nq, kv_pairs = nq.d.B * nq.d.Nkv;
    qR_ = bf16_buffer(nq, q_pairs), qT_ = bf16_buffer(nq, q_pairs), dR_ = bf16_buffer(nq, q_pairs);
    dT_ = bf16_buffer(nq, q_pairs), kT_ = bf16_buffer(nk, kv_pairs), vT_ = bf16_buffer(nk, kv_pairs);
    kN_ = bf16_buffer(nk, kv_pairs);
    pack_native<NativePack::Rows, NativePack::Cols>(nq, q, q_pairs, scale, rope, qR_.data<bf16>(), qT_.data<bf16>());
    pack_native<NativePack::Rows, NativePack::Cols>(nq, dout, q_pairs, 1.0f, nullptr, dR_.data<bf16>(),
                                                    dT_.data<bf16>());
    pack_native<NativePack::EPairs, NativePack::RowPairs>(nk, k, kv_pairs, 1.0f, rope, kT_.data<bf16>(),
                                                          kN_.data<bf16>());
    pack_native<NativePack::EPairs>(nk, v, kv_pairs, 1.0f, nullptr, vT_.data<bf16>());
    qR = qR_.data<bf16>(), qT = qT_.data<bf16>(), dR = dR_.data<bf16>(), dT = dT_.data<bf16>();
    kT = kT_.data<bf16>(), vT = vT_.data<bf16>(), kN = kN_.data<bf16>();
  }
};

// Calls f with the block-product backend `b` names (as a value of its type).
template <class F>
void with_backend(NativeBf16 b, F f) {
  MOE_ASSERT_MSG(native_bf16_supported(b), "{} is not available on this CPU", native_bf16_name(b));
  switch (b) {
    case NativeBf16::Avx512Bf16:
      return f(Avx512Bf16Blocks{});
    case NativeBf16::AmxEmulated:
      return f(AmxBlocks<amx::Emulated>{});
    case NativeBf16::Amx:
      return f(AmxBlocks<amx::Native>{});
  }
}

}  // namespace
}  // namespace moecore::kernels::flash
