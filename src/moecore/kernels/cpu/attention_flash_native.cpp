// FlashAttention-2-style causal GQA attention whose block products run on bf16 operands with f32 accumulation in
// native bf16 instructions (AVX512-BF16 or AMX, attention_blocks_bf16.h), for --bf16 training on CPUs that have them.
// The schedule is the f32 flash kernel's (attention_flash.cpp, whose formulas hold here): tiles of kAttnTile queries ×
// keys, online softmax, tiles above the diagonal skipped and the diagonal's discarded half not computed, backward
// fused per (b, kv head) or in two passes (use_fused), the same order of every dQ, dK, dV term in both, one writer
// per output element. What differs is the operands: every one is rounded to bf16 once per call and packed in the
// layout the instructions read (A row-major, B in k pairs), each kv head once (GQA reads its kv head's pack), with
// the head width padded to Dp (a multiple of 32) and tiles padded with zeros:
//   forward:  S = Q̂·K̂ᵀ (B: K̂ᵀ in d pairs);  P as the f32 kernel;  O += bf16(P ⊙ Z)·V̂ (B: V̂ in key pairs)
//   backward: S = Q̂·K̂ᵀ;  dP = dÔ·V̂ᵀ;  dVᵀ += dÔᵀ·P̂ (A: dÔᵀ rows; B: P̂ in query pairs);  dKᵀ += Q̂ᵀ·dŜ (likewise);
//             dQ += dŜ·K̂ (B: K̂ in key pairs; f32 rows [Sp, Dp] per head, times scale once at the end)
// dK and dV are summed transposed ([Dp, keys]) so that P̂ and dŜ enter as B operands, whose query pairs are two rows
// interleaved (a vector operation), rather than as Aᵀ (a transpose of each tile).
// where Q̂ = bf16(scale·Q) (so dK needs no scale), P̂ = bf16(P ⊙ Z), dŜ = bf16(P ⊙ (Z ⊙ dP − Δ)). Dropout (Z) costs
// nothing extra here, so it is supported as in the f32 kernel. The pair sums of vdpbf16ps/TDPBF16PS run in a fixed
// order, so results are bitwise reproducible whatever the thread count.
#include "moecore/kernels/cpu/attention_flash_native.h"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>

#include "moecore/core/allocator.h"
#include "moecore/kernels/cpu/amx_tiles.h"
#include "moecore/kernels/cpu/vec_math.h"

namespace moecore::kernels {

namespace {

uint64_t cpu_xcr0() {
  uint32_t eax, edx;
  asm volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (uint64_t(edx) << 32) | eax;
}

bool cpu_osxsave() {
  unsigned a, b, c, d;
  return __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 27));
}

bool cpu_avx512_bf16() {
  unsigned a, b, c, d;
  if (!cpu_osxsave() || (cpu_xcr0() & 0xE6) != 0xE6) return false;  // SSE, AVX, opmask and both ZMM halves saved
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  const bool f_bw_vl = (b & (1u << 16)) && (b & (1u << 30)) && (b & (1u << 31));
  if (!f_bw_vl || a < 1 || !__get_cpuid_count(7, 1, &a, &b, &c, &d)) return false;
  return a & (1u << 5);  // leaf 7 subleaf 1 EAX bit 5: AVX512_BF16
}

bool cpu_amx() {
  unsigned a, b, c, d;
  if (!cpu_osxsave() || (cpu_xcr0() & (3u << 17)) != (3u << 17)) return false;  // XTILECFG, XTILEDATA
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  if (!(d & (1u << 22)) || !(d & (1u << 24))) return false;  // AMX-BF16, AMX-TILE
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}

// One tile product through the instructions against the emulation (small integers: exact in any order, so the two
// must agree bit for bit). The AMX path was written on CPUs without AMX; should the instructions ever disagree on a
// CPU that has them, bf16 attention falls back to AVX512-BF16 and says so once, instead of training on wrong sums.
bool tiles_agree_with_emulation() {
  alignas(64) uint16_t a[amx::kRows][32], b[amx::kRows][32];
  alignas(64) float native[amx::kRows][16], emulated[amx::kRows][16];
  for (int r = 0; r < amx::kRows; r++)
    for (int j = 0; j < 32; j++) {
      a[r][j] = float_to_bf16(static_cast<float>((r * 7 + j * 3) % 7 - 3)).bits;
      b[r][j] = float_to_bf16(static_cast<float>((r * 5 + j) % 5 - 2)).bits;
    }
  auto run = [&](auto tiles, float(*c)[16]) {
    using Tiles = decltype(tiles);
    Tiles::configure();
    Tiles::template zero<0>();
    Tiles::template load<1>(a, 64);
    Tiles::template load<2>(b, 64);
    Tiles::template dp<0, 1, 2>();
    Tiles::template store<0>(c, 64);
    Tiles::release();
  };
  run(amx::Native{}, native);
  run(amx::Emulated{}, emulated);
  if (std::memcmp(native, emulated, sizeof native) == 0) return true;
  std::fprintf(stderr,
               "moecore: warning: this CPU's AMX tile products disagree with their emulation; bf16 attention uses "
               "AVX512-BF16 instead (please report the CPU model)\n");
  return false;
}

}  // namespace

namespace amx {
bool usable() {
  static const bool ok = cpu_amx() && tiles_agree_with_emulation();
  return ok;
}
}  // namespace amx

namespace flash {

const char* native_bf16_name(NativeBf16 b) {
  switch (b) {
    case NativeBf16::Avx512Bf16:
      return "AVX512-BF16";
    case NativeBf16::AmxEmulated:
      return "AMX (emulated)";
    case NativeBf16::Amx:
      return "AMX";
  }
  return "?";
}

bool native_bf16_supported(NativeBf16 b) {
  static const bool avx512 = cpu_avx512_bf16();
  switch (b) {
    case NativeBf16::Avx512Bf16:
      return avx512;
    case NativeBf16::AmxEmulated:
      return true;
    case NativeBf16::Amx:
      return amx::usable();
  }
  return false;
}

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

// Columns [e0, e0+32) of a tile's rows, rounded (buf), into the tile's layout P.
template <NativePack P>
MOE_ALWAYS_INLINE void emit_tile_cols(const uint16_t (*buf)[32], int64_t Dp, int64_t e0, uint16_t* out) {
  if constexpr (P == NativePack::Rows)
    for (int64_t s = 0; s < kTn; s++) std::memcpy(out + s * Dp + e0, buf[s], sizeof buf[s]);
  if constexpr (P == NativePack::RowPairs)
    for (int64_t p = 0; p < kTn / 2; p++) {
      uint32_t pairs[32];
#pragma omp simd
      for (int64_t e = 0; e < 32; e++) pairs[e] = uint32_t(buf[2 * p][e]) | uint32_t(buf[2 * p + 1][e]) << 16;
      std::memcpy(out + p * 2 * Dp + 2 * e0, pairs, sizeof pairs);
    }
  if constexpr (P == NativePack::Cols)
    for (int64_t e = 0; e < 32; e++)
      for (int64_t s = 0; s < kTn; s++) out[(e0 + e) * kTn + s] = buf[s][e];
  if constexpr (P == NativePack::EPairs)
    for (int64_t ep = 0; ep < 16; ep++) {
      uint32_t pairs[kTn];  // (e0 + 2ep, e0 + 2ep + 1) of each row: one little-endian word of buf
      for (int64_t s = 0; s < kTn; s++) std::memcpy(&pairs[s], &buf[s][2 * ep], 4);
      std::memcpy(out + (e0 / 2 + ep) * 2 * kTn, pairs, sizeof pairs);
    }
}

// dst [heads, nt, tile] ← bf16(mul · src) in layout P (and into dst2 in layout P2 when given: one read of src for
// both), zero past S and D. Each tile goes through 32 columns at a time of rows rounded in a stack buffer
// (vectorized), then into its layouts.
template <NativePack P, NativePack P2 = P>
MOE_TARGET_CLONES void pack_native(const NativeDims& n, Heads<float> src, int64_t heads, float mul, bf16* dst,
                                   bf16* dst2 = nullptr) {
  const int64_t D = n.d.D, Dp = n.Dp, nt = n.nt;
#pragma omp parallel for schedule(static) collapse(2)
  for (int64_t bn = 0; bn < heads; bn++)
    for (int64_t t = 0; t < nt; t++) {
      const int64_t off = (bn * nt + t) * n.tile();
      for (int64_t e0 = 0; e0 < Dp; e0 += 32) {
        alignas(64) uint16_t buf[kTn][32];
        const int64_t w = std::clamp<int64_t>(D - e0, 0, 32);
        for (int64_t s = 0; s < kTn; s++) {
          const int64_t row = t * kTn + s, m = row < n.d.S ? w : 0;
          const float* in = src.at(bn, std::min(row, n.d.S - 1)) + e0;
#pragma omp simd
          for (int64_t e = 0; e < m; e++) buf[s][e] = float_to_bf16(in[e] * mul).bits;
          for (int64_t e = m; e < 32; e++) buf[s][e] = 0;
        }
        emit_tile_cols<P>(buf, Dp, e0, &dst[off].bits);
        if (dst2) emit_tile_cols<P2>(buf, Dp, e0, &dst2[off].bits);
      }
    }
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

struct NativeFwd {
  NativeDims n;
  const bf16 *qR, *kT, *vN;  // Q̂ rows per query head pair, K̂ᵀ in d pairs and V̂ in key pairs per kv head pair
  float *o, *lse;
  const AttentionDropout* drop;
};

template <class G>
MOE_TARGET_CLONES void native_forward_items(const NativeFwd& a, Scratch<float>& scratch) {
  const AttentionDims& d = a.n.d;
  const int64_t S = d.S, D = d.D, Dp = a.n.Dp, nt = a.n.nt, pairs = d.B * d.Nq;
  _Pragma("omp parallel for schedule(dynamic, 1)") for (int64_t it = 0; it < pairs * nt; it++) {
    const int64_t qt = nt - 1 - it / pairs, bh = it % pairs;  // longest rows of tiles first
    const int64_t b = bh / d.Nq, h = bh % d.Nq, bg = b * d.Nkv + h / d.group();
    float* acc = scratch.mine();                 // [kTn, Dp]
    float* sc = acc + kTn * Dp;                  // [kTn, kTn] scores
    float* m = sc + kTn * kTn;                   // [kTn]
    float* l = m + kTn;                          // [kTn]
    float* z = l + kTn;                          // [kTn] dropout multipliers
    bf16* P = reinterpret_cast<bf16*>(z + kTn);  // [kTn, kTn]
    const int64_t i0 = qt * kTn, nr = std::min(kTn, S - i0), M = round_up(nr, 16);
    const bf16* Qs = ptile(a.qR, a.n, bh, qt);
    for (int64_t i = 0; i < M; i++) {
      m[i] = -std::numeric_limits<float>::infinity();
      l[i] = 0;
    }
    std::fill_n(P, M * kTn, bf16{0});
    G::begin();
    for (int64_t kt = 0; kt <= qt; kt++) {
      const int64_t j0 = kt * kTn, nc = std::min(kTn, S - j0);
      const bool diag = kt == qt;
      G::run({M, kTn, Dp, Qs, Dp, ptile(a.kT, a.n, bg, kt), 2 * kTn, sc, kTn, false,
              diag ? Causal::ColsUpToRow : Causal::Full});
      for (int64_t i = 0; i < nr; i++) {
        const int64_t jmax = diag ? std::min(nc, i + 1) : nc;  // visible keys of row i
        float* s = sc + i * kTn;
        const float alpha = online_softmax_row(s, jmax, m[i], l[i], z, [&](float* zr) {
          if (a.drop) a.drop->row(b, h, i0 + i, j0, jmax, zr);
          return a.drop != nullptr;
        });
        bf16* p = P + i * kTn;
#pragma omp simd
        for (int64_t j = 0; j < jmax; j++) p[j] = float_to_bf16(s[j]);
        for (int64_t j = jmax; j < kTn; j++) p[j] = bf16{0};
        if (kt > 0 && alpha != 1.0f) {  // at kt = 0 the product below stores acc
          float* ar = acc + i * Dp;
#pragma omp simd
          for (int64_t e = 0; e < Dp; e++) ar[e] *= alpha;
        }
      }
      G::run({M, Dp, kTn, P, kTn, ptile(a.vN, a.n, bg, kt), 2 * Dp, acc, Dp, kt > 0,
              diag ? Causal::KUpToRow : Causal::Full});
    }
    G::end();
    for (int64_t i = 0; i < nr; i++) {
      float* out = a.o + (i0 + i) * d.q_row() + bh * D;
      const float inv = 1.0f / l[i];
#pragma omp simd
      for (int64_t e = 0; e < D; e++) out[e] = acc[i * Dp + e] * inv;
      a.lse[bh * S + i0 + i] = m[i] + std::log(l[i]);
    }
  }
}

struct NativeBwd {
  NativeDims n;
  const bf16 *qR, *qT, *dR, *dT;  // per query head pair: Q̂ and dÔ as rows and transposed
  const bf16 *kT, *vT, *kN;       // per kv head pair: K̂ᵀ, V̂ᵀ in d pairs, K̂ in key pairs
  const float *lse, *delta;
  float* dQacc;  // [B·Nq, Sp, Dp]
  float *dq, *dk, *dv;
  float dq_mul;
  const AttentionDropout* drop;
};

// Per-thread buffers of one backward item.
struct NativeTiles {
  float *sc, *dp, *dKt, *dVt, *z;  // [kTn, kTn] ×2, [Dp, kTn] ×2, [kTn]
  bf16 *P, *dS;                    // [kTn, kTn] each
  uint32_t *Pp, *dSp;              // [kTn/2, kTn] each: P and dS in query pairs
  NativeTiles(float* w, int64_t Dp)
      : sc(w), dp(sc + kTn * kTn), dKt(dp + kTn * kTn), dVt(dKt + kTn * Dp), z(dVt + kTn * Dp) {
    Pp = reinterpret_cast<uint32_t*>(z + kTn);
    dSp = Pp + kTn * kTn / 2;
    P = reinterpret_cast<bf16*>(dSp + kTn * kTn / 2);
    dS = P + kTn * kTn;
  }
  static int64_t floats(int64_t Dp) { return 2 * kTn * kTn + 2 * kTn * Dp + kTn + 4 * kTn * kTn / 2; }
};

// One (query tile, key tile) pair of head h: recomputes P and dS, then adds into the dK/dV tiles (when kv) and into
// dQ's f32 rows (when dq).
template <class G>
MOE_ALWAYS_INLINE void native_pair(const NativeBwd& a, int64_t b, int64_t h, int64_t qt, int64_t kt, NativeTiles& w,
                                   bool kv, bool dq) {
  const AttentionDims& d = a.n.d;
  const int64_t S = d.S, Dp = a.n.Dp;
  const int64_t bh = b * d.Nq + h, bg = b * d.Nkv + h / d.group();
  const int64_t i0 = qt * kTn, nr = std::min(kTn, S - i0), j0 = kt * kTn, nc = std::min(kTn, S - j0);
  const int64_t Mq = round_up(nr, 16);
  const bool diag = qt == kt;
  const Causal cols = diag ? Causal::ColsUpToRow : Causal::Full;
  G::run({Mq, kTn, Dp, ptile(a.qR, a.n, bh, qt), Dp, ptile(a.kT, a.n, bg, kt), 2 * kTn, w.sc, kTn, false, cols});
  G::run({Mq, kTn, Dp, ptile(a.dR, a.n, bh, qt), Dp, ptile(a.vT, a.n, bg, kt), 2 * kTn, w.dp, kTn, false, cols});
  for (int64_t i = 0; i < nr; i++) {
    const int64_t jmax = diag ? std::min(nc, i + 1) : nc;
    bf16* pr = w.P + i * kTn;
    bf16* dsr = w.dS + i * kTn;
    if (a.drop) a.drop->row(b, h, i0 + i, j0, jmax, w.z);
    // Q̂ carries the scale: the scores need no multiplier (1·s is s).
    softmax_backward_row(w.sc + i * kTn, w.dp + i * kTn, 1.0f, a.lse[bh * S + i0 + i], a.delta[bh * S + i0 + i],
                         a.drop ? w.z : nullptr, jmax, pr, dsr, [](float x) { return float_to_bf16(x); });
    for (int64_t j = jmax; j < kTn; j++) pr[j] = dsr[j] = bf16{0};
  }
  std::fill(w.P + nr * kTn, w.P + kTn * kTn, bf16{0});
  std::fill(w.dS + nr * kTn, w.dS + kTn * kTn, bf16{0});
  if (kv) {
    const Causal from = diag ? Causal::KFromCol : Causal::Full;
    row_pairs(w.P, w.Pp);
    row_pairs(w.dS, w.dSp);
    const bf16* Pp = reinterpret_cast<const bf16*>(w.Pp);
    const bf16* dSp = reinterpret_cast<const bf16*>(w.dSp);
    const bool first = qt == kt && h % d.group() == 0;  // the key tile's first pair stores dKᵀ, dVᵀ
    G::run({Dp, kTn, kTn, ptile(a.dT, a.n, bh, qt), kTn, Pp, 2 * kTn, w.dVt, kTn, !first, from});
    G::run({Dp, kTn, kTn, ptile(a.qT, a.n, bh, qt), kTn, dSp, 2 * kTn, w.dKt, kTn, !first, from});
  }
  if (dq)
    G::run({Mq, Dp, kTn, w.dS, kTn, ptile(a.kN, a.n, bg, kt), 2 * Dp, a.dQacc + (bh * a.n.Sp + i0) * Dp, Dp, kt > 0,
            diag ? Causal::KUpToRow : Causal::Full});
}

// dK and dV of key tile kt of kv head (b, g): the sum over the group's query heads and the query tiles from kt on.
template <class G>
MOE_ALWAYS_INLINE void native_key_tile(const NativeBwd& a, int64_t b, int64_t g, int64_t kt, NativeTiles& w, bool dq) {
  const AttentionDims& d = a.n.d;
  const int64_t D = d.D, j0 = kt * kTn, nc = std::min(kTn, d.S - j0), bg = b * d.Nkv + g;
  for (int64_t h = g * d.group(); h < (g + 1) * d.group(); h++)
    for (int64_t qt = kt; qt < a.n.nt; qt++) native_pair<G>(a, b, h, qt, kt, w, true, dq);
  for (int64_t j = 0; j < nc; j++) {
    float* dkr = a.dk + (j0 + j) * d.kv_row() + bg * D;
    float* dvr = a.dv + (j0 + j) * d.kv_row() + bg * D;
#pragma omp simd
    for (int64_t e = 0; e < D; e++) {
      dkr[e] = w.dKt[e * kTn + j];
      dvr[e] = w.dVt[e * kTn + j];
    }
  }
}

// dQ rows [i0, i0+n) of head bh written out times dq_mul (their f32 sums start at each row's kt = 0 pair).
MOE_ALWAYS_INLINE void native_dq_rows(const NativeBwd& a, int64_t bh, int64_t i0, int64_t n) {
  const AttentionDims& d = a.n.d;
  const int64_t Dp = a.n.Dp;
  const float* acc = a.dQacc + (bh * a.n.Sp + i0) * Dp;
  for (int64_t i = 0; i < n; i++) {
    float* r = a.dq + (i0 + i) * d.q_row() + bh * d.D;
#pragma omp simd
    for (int64_t e = 0; e < d.D; e++) r[e] = acc[i * Dp + e] * a.dq_mul;
  }
}

template <class G>
MOE_TARGET_CLONES void native_backward_fused(const NativeBwd& a, Scratch<float>& scratch) {
  const AttentionDims& d = a.n.d;
  _Pragma("omp parallel for schedule(dynamic, 1)") for (int64_t bg = 0; bg < d.B * d.Nkv; bg++) {
    const int64_t b = bg / d.Nkv, g = bg % d.Nkv;
    NativeTiles w(scratch.mine(), a.n.Dp);
    G::begin();
    for (int64_t kt = 0; kt < a.n.nt; kt++) native_key_tile<G>(a, b, g, kt, w, true);
    G::end();
    for (int64_t h = g * d.group(); h < (g + 1) * d.group(); h++) native_dq_rows(a, b * d.Nq + h, 0, d.S);
  }
}

template <class G>
MOE_TARGET_CLONES void native_backward_two_pass(const NativeBwd& a, Scratch<float>& scratch) {
  const AttentionDims& d = a.n.d;
  const int64_t nt = a.n.nt, kv_pairs = d.B * d.Nkv, q_pairs = d.B * d.Nq;
  _Pragma("omp parallel for schedule(dynamic, 1)") for (int64_t it = 0; it < kv_pairs * nt; it++) {
    NativeTiles w(scratch.mine(), a.n.Dp);
    const int64_t bg = it % kv_pairs;
    G::begin();
    native_key_tile<G>(a, bg / d.Nkv, bg % d.Nkv, it / kv_pairs, w, false);
    G::end();
  }
  _Pragma("omp parallel for schedule(dynamic, 1)") for (int64_t it = 0; it < q_pairs * nt; it++) {
    NativeTiles w(scratch.mine(), a.n.Dp);
    const int64_t qt = nt - 1 - it / q_pairs, bh = it % q_pairs, i0 = qt * kTn;
    const int64_t b = bh / d.Nq, h = bh % d.Nq, n = std::min(kTn, d.S - i0);
    G::begin();
    for (int64_t kt = 0; kt <= qt; kt++) native_pair<G>(a, b, h, qt, kt, w, false, true);
    G::end();
    native_dq_rows(a, bh, i0, n);
  }
}

void require_f32_native(const Tensor& q) {
  MOE_ASSERT_MSG(q.dtype() == DType::F32, "bf16 attention takes f32 tensors (rounded to bf16 inside), got {}",
                 dtype_name(q.dtype()));
}

// delta [B·Nq, S] ← Δ_i = Σ_d dO_id·O_id per row (f32, in a fixed vector order).
MOE_TARGET_CLONES void native_delta(const AttentionDims& d, const float* dout, const float* o, float* delta) {
#pragma omp parallel for schedule(static) collapse(2)
  for (int64_t r = 0; r < d.B * d.Nq; r++)
    for (int64_t i = 0; i < d.S; i++) {
      const int64_t off = i * d.q_row() + r * d.D;  // r = b·Nq + h matches the [S, B, Nq, D] layout
      float s = 0;
#pragma omp simd reduction(+ : s)
      for (int64_t e = 0; e < d.D; e++) s += dout[off + e] * o[off + e];
      delta[r * d.S + i] = s;
    }
}

Tensor bf16_buffer(const NativeDims& n, int64_t heads) {
  return Tensor::empty({heads * n.nt * n.tile()}, DType::BF16);
}

template <class G>
void forward_with(const Tensor& q, const Tensor& k, const Tensor& v, double scale, Tensor& o, Tensor& lse,
                  const AttentionDropout* dropout) {
  const NativeDims n(attention_forward_dims(q, k, v, o, lse));
  const AttentionDims& d = n.d;
  const int64_t kv_pairs = d.B * d.Nkv;
  Tensor qR = bf16_buffer(n, d.B * d.Nq), kT = bf16_buffer(n, kv_pairs), vN = bf16_buffer(n, kv_pairs);
  pack_native<NativePack::Rows>(n, heads_of(q.data<float>(), d, d.Nq), d.B * d.Nq, static_cast<float>(scale),
                                qR.data<bf16>());
  pack_native<NativePack::EPairs>(n, heads_of(k.data<float>(), d, d.Nkv), kv_pairs, 1.0f, kT.data<bf16>());
  pack_native<NativePack::RowPairs>(n, heads_of(v.data<float>(), d, d.Nkv), kv_pairs, 1.0f, vN.data<bf16>());
  NativeFwd a{n, qR.data<bf16>(), kT.data<bf16>(), vN.data<bf16>(), o.data<float>(), lse.data<float>(), dropout};
  // acc [kTn, Dp], scores [kTn, kTn], m, l, z [kTn] in f32, then P [kTn, kTn] in bf16 (half a float each).
  Scratch<float> scratch(kTn * n.Dp + kTn * kTn + 3 * kTn + kTn * kTn / 2, DType::F32);
  native_forward_items<G>(a, scratch);
}

template <class G>
void backward_with(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                   const Tensor& lse, double scale, Tensor& dq, Tensor& dk, Tensor& dv,
                   const AttentionDropout* dropout) {
  const NativeDims n(attention_backward_dims(dout, q, k, v, o, lse, dq, dk, dv));
  const AttentionDims& d = n.d;
  const int64_t kv_pairs = d.B * d.Nkv, q_pairs = d.B * d.Nq;
  Tensor delta = Tensor::empty({q_pairs, d.S}, DType::F32);
  native_delta(d, dout.data<float>(), o.data<float>(), delta.data<float>());
  const float sc = static_cast<float>(scale);
  const Heads<float> qh = heads_of(q.data<float>(), d, d.Nq), doh = heads_of(dout.data<float>(), d, d.Nq);
  const Heads<float> kh = heads_of(k.data<float>(), d, d.Nkv), vh = heads_of(v.data<float>(), d, d.Nkv);
  Tensor qR = bf16_buffer(n, q_pairs), qT = bf16_buffer(n, q_pairs), dR = bf16_buffer(n, q_pairs),
         dT = bf16_buffer(n, q_pairs);
  Tensor kT = bf16_buffer(n, kv_pairs), vT = bf16_buffer(n, kv_pairs), kN = bf16_buffer(n, kv_pairs);
  pack_native<NativePack::Rows, NativePack::Cols>(n, qh, q_pairs, sc, qR.data<bf16>(), qT.data<bf16>());
  pack_native<NativePack::Rows, NativePack::Cols>(n, doh, q_pairs, 1.0f, dR.data<bf16>(), dT.data<bf16>());
  pack_native<NativePack::EPairs, NativePack::RowPairs>(n, kh, kv_pairs, 1.0f, kT.data<bf16>(), kN.data<bf16>());
  pack_native<NativePack::EPairs>(n, vh, kv_pairs, 1.0f, vT.data<bf16>());
  Tensor dQacc = Tensor::empty({q_pairs * n.Sp * n.Dp}, DType::F32);
  NativeBwd a{n,
              qR.data<bf16>(),
              qT.data<bf16>(),
              dR.data<bf16>(),
              dT.data<bf16>(),
              kT.data<bf16>(),
              vT.data<bf16>(),
              kN.data<bf16>(),
              lse.data<float>(),
              delta.data<float>(),
              dQacc.data<float>(),
              dq.data<float>(),
              dk.data<float>(),
              dv.data<float>(),
              sc,
              dropout};
  Scratch<float> scratch(NativeTiles::floats(n.Dp), DType::F32);
  if (use_fused(d))
    native_backward_fused<G>(a, scratch);
  else
    native_backward_two_pass<G>(a, scratch);
}

}  // namespace

int64_t backward_native_bytes(int64_t S, int64_t B, int64_t Nq, int64_t Nkv, int64_t D) {
  AttentionDims a{};
  a.S = S, a.B = B, a.Nq = Nq, a.Nkv = Nkv, a.D = D;
  const NativeDims n(a);
  const auto bytes = [](int64_t numel, int64_t size) {
    return static_cast<int64_t>(Allocator::round_size(static_cast<size_t>(numel * size)));
  };
  const int64_t q_tiles = B * Nq * n.nt * n.tile(), kv_tiles = B * Nkv * n.nt * n.tile();
  // backward_with's buffers: Δ, the four packs of q and dout, the three of k and v, the dQ accumulator.
  return bytes(B * Nq * S, 4) + 4 * bytes(q_tiles, 2) + 3 * bytes(kv_tiles, 2) + bytes(B * Nq * n.Sp * n.Dp, 4);
}

bool has_native_bf16() {
  return native_bf16_supported(NativeBf16::Amx) || native_bf16_supported(NativeBf16::Avx512Bf16);
}

NativeBf16 best_native_bf16() {
  MOE_ASSERT_MSG(has_native_bf16(), "this CPU has neither AMX nor AVX512-BF16");
  return native_bf16_supported(NativeBf16::Amx) ? NativeBf16::Amx : NativeBf16::Avx512Bf16;
}

namespace {
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

void forward_native(const Tensor& q, const Tensor& k, const Tensor& v, double scale, Tensor& o, Tensor& lse,
                    const AttentionDropout* dropout, NativeBf16 backend) {
  require_f32_native(q);
  if (dropout && !dropout->on()) dropout = nullptr;
  with_backend(backend, [&](auto g) { forward_with<decltype(g)>(q, k, v, scale, o, lse, dropout); });
}

void backward_native(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                     const Tensor& lse, double scale, Tensor& dq, Tensor& dk, Tensor& dv,
                     const AttentionDropout* dropout, NativeBf16 backend) {
  require_f32_native(q);
  if (dropout && !dropout->on()) dropout = nullptr;
  with_backend(backend, [&](auto g) { backward_with<decltype(g)>(dout, q, k, v, o, lse, scale, dq, dk, dv, dropout); });
}

}  // namespace flash
}  // namespace moecore::kernels
