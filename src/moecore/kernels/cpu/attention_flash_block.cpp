// Blocks of causal GQA attention at global positions, for context parallelism (see attention.h,
// attention_block_forward): the flash kernel of attention_flash.cpp with query rows at q0.. and keys at k0...
//
// Tiles of kAttnTile queries × kAttnTile keys, every product a register-blocked block GEMM (attention_blocks.h).
// A tile whose first key lies past its last query's position is skipped (and every later one: keys only grow); a
// tile whose last key is at or before its first query's position is wholly visible; the others mask per row
// (key j visible to row i when k0 + j ≤ q0 + i). The single-rank kernel's diagonal-tile shortcuts assume q0 = k0
// on tile boundaries, so this file masks explicitly instead and leaves attention_flash.cpp untouched (its bits stay).
//   forward, per (b, h, query tile): the online softmax over the visible key tiles; o /= l, lse = m + log l, a row
//     that sees no key gets o = 0, lse = −inf (the merge ignores it).
//   merge: lse = log(e^lse₁ + e^lse₂), o = (e^(lse₁−lse) o₁ + e^(lse₂−lse) o₂).
//   backward, with P = exp(scale·Q·Kᵀ − lse_final) and Δ_i = Σ_d dO_id·O_id of the final o: two passes, each output
//     element with one writer: dK, dV per (b, kv head, key tile) over the group's heads and query tiles ascending;
//     dQ per (b, head, query tile) over key tiles ascending, added to dq.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "moecore/core/cpu.h"
#include "moecore/kernels/attention.h"
#include "moecore/kernels/cpu/attention_blocks.h"
#include "moecore/kernels/cpu/attention_flash.h"
#include "moecore/kernels/cpu/attention_flash_native.h"
#include "moecore/kernels/cpu/kernels.h"
#include "moecore/kernels/cpu/vec_math.h"

namespace moecore::kernels {

namespace flash_block {

using flash::BackwardTiles;
using flash::Causal;
using flash::MatA;
using flash::MatB;
using flash::MatC;
using flash::Scratch;
using flash::Vec;
constexpr int64_t Bt = kAttnTile;

template <bool R, typename T>
MOE_ALWAYS_INLINE T rnd(T x) {
  if constexpr (R && std::is_same_v<T, float>)
    return bf16_to_float(float_to_bf16(x));
  else
    return x;
}

struct BlockDims {
  int64_t Sq, Sk, B, Nq, Nkv, D, q0, k0;
  int64_t group() const { return Nq / Nkv; }
  int64_t q_row() const { return B * Nq * D; }
  int64_t kv_row() const { return B * Nkv * D; }
  int64_t qtiles() const { return (Sq + Bt - 1) / Bt; }
  int64_t ktiles() const { return (Sk + Bt - 1) / Bt; }
  // Visible keys of local row i within the key tile starting at local key j0 (0 .. nc).
  int64_t visible(int64_t i, int64_t j0, int64_t nc) const {
    return std::clamp(q0 + i - (k0 + j0) + 1, int64_t{0}, nc);
  }
  // Key tile kt has a key visible to some row of query tile qt.
  bool any(int64_t qt, int64_t kt) const { return k0 + kt * Bt <= q0 + std::min(Sq, (qt + 1) * Bt) - 1; }
};

BlockDims block_dims(const Tensor& q, const Tensor& k, const Tensor& v, int64_t q0, int64_t k0) {
  MOE_ASSERT_MSG(q.ndim() == 4 && k.ndim() == 4, "attention block wants [S, B, N, D], got q {} k {}", q.shape().str(),
                 k.shape().str());
  BlockDims d{q.dim(0), k.dim(0), q.dim(1), q.dim(2), k.dim(2), q.dim(3), q0, k0};
  MOE_ASSERT_SHAPE(k, {d.Sk, d.B, d.Nkv, d.D});
  MOE_ASSERT_SHAPE(v, {d.Sk, d.B, d.Nkv, d.D});
  MOE_ASSERT_MSG(d.Nkv > 0 && d.Nq % d.Nkv == 0, "query heads {} not a multiple of kv heads {}", d.Nq, d.Nkv);
  MOE_ASSERT(q.dtype() == k.dtype() && q.dtype() == v.dtype());
  return d;
}

// The dropout of this block: the caller's, with q0 and k0 added to its global positions.
AttentionDropout shifted(const AttentionDropout* in, int64_t q0, int64_t k0) {
  AttentionDropout out = *in;
  const int64_t key_base = in->key_offset < 0 ? in->seq_offset : in->key_offset;
  out.seq_offset = in->seq_offset + q0;
  out.key_offset = key_base + k0;
  return out;
}

// dst [B·Nkv, tiles, D, Bt] ← key tiles of src [Sk, B, Nkv, D] transposed (zero past Sk), rounded when R.
template <typename T, bool R>
void pack_t(const BlockDims& d, const T* src, T* dst) {
  const int64_t D = d.D, nt = d.ktiles(), pairs = d.B * d.Nkv;
#pragma omp parallel for schedule(static) collapse(2)
  for (int64_t bg = 0; bg < pairs; bg++)
    for (int64_t t = 0; t < nt; t++) {
      T* out = dst + (bg * nt + t) * D * Bt;
      for (int64_t j = 0; j < Bt; j++) {
        const int64_t s = t * Bt + j;
        for (int64_t e = 0; e < D; e++) out[e * Bt + j] = s < d.Sk ? rnd<R>(src[s * d.kv_row() + bg * D + e]) : T(0);
      }
    }
}

// dst [n, D] ← rnd(mul · rows s0.. of head `head` of src (row stride ld)).
template <typename T, bool R>
MOE_ALWAYS_INLINE void rows(const T* src, int64_t ld, int64_t head, int64_t s0, int64_t n, int64_t D, T mul, T* dst) {
  for (int64_t i = 0; i < n; i++) {
    const T* in = src + (s0 + i) * ld + head * D;
    for (int64_t e = 0; e < D; e++) dst[i * D + e] = rnd<R>(in[e] * mul);
  }
}

// forward_t's query tiles, shared among the calling team; ktd: the keys packed by pack_t.
template <typename T, bool R>
MOE_ALWAYS_INLINE void forward_tiles(const BlockDims& d, const T* qd, const T* ktd, const T* vd, T sc_mul, T* od, T* ld,
                                     const AttentionDropout* drop, Scratch<T>& scratch) {
  constexpr int64_t L = Vec<T>::kLanes;
  const int64_t D = d.D, nqt = d.qtiles(), nkt = d.ktiles(), pairs = d.B * d.Nq;
#pragma omp for schedule(dynamic, 1)
  for (int64_t it = 0; it < pairs * nqt; it++) {
    const int64_t qt = nqt - 1 - it / pairs, bh = it % pairs;
    const int64_t b = bh / d.Nq, h = bh % d.Nq, bg = b * d.Nkv + h / d.group();
    T* Qs = scratch.mine();
    T* acc = Qs + Bt * D;
    T* Vs = acc + Bt * D;
    T* sc = Vs + Bt * D;
    T* m = sc + Bt * Bt;
    T* l = m + Bt;
    T* z = l + Bt;
    const int64_t i0 = qt * Bt, nr = std::min(Bt, d.Sq - i0);
    rows<T, R>(qd, d.q_row(), bh, i0, nr, D, sc_mul, Qs);
    std::fill_n(m, nr, -std::numeric_limits<T>::infinity());
    std::fill_n(l, nr, T(0));
    std::fill_n(acc, nr * D, T(0));
    for (int64_t t = 0; t < nkt && d.any(qt, t); t++) {
      const int64_t j0 = t * Bt, nc = std::min(Bt, d.Sk - j0);
      flash::block_gemm<T>(nr, (nc + L - 1) / L * L, D, MatA<T>{Qs, D, 1}, MatB<T>{ktd + (bg * nkt + t) * D * Bt, Bt},
                           MatC<T>{sc, Bt}, false, Causal::Full);
      for (int64_t i = 0; i < nr; i++) {
        const int64_t jmax = d.visible(i0 + i, j0, nc);
        T* s = sc + i * Bt;
        if (jmax == 0) {
          std::fill_n(s, nc, T(0));
          continue;
        }
        const T alpha = flash::online_softmax_row(s, jmax, m[i], l[i], z, [&](T* zr) {
          if (drop) drop->row(b, h, i0 + i, j0, jmax, zr);
          return drop != nullptr;
        });
        if constexpr (R) {
#pragma omp simd
          for (int64_t j = 0; j < jmax; j++) s[j] = rnd<R>(s[j]);
        }
        for (int64_t j = jmax; j < nc; j++) s[j] = 0;
        if (alpha != T(1)) {
#pragma omp simd
          for (int64_t e = 0; e < D; e++) acc[i * D + e] *= alpha;
        }
      }
      rows<T, R>(vd, d.kv_row(), bg, j0, nc, D, T(1), Vs);
      flash::block_gemm<T>(nr, D, nc, MatA<T>{sc, Bt, 1}, MatB<T>{Vs, D}, MatC<T>{acc, D}, true, Causal::Full);
    }
    for (int64_t i = 0; i < nr; i++) {
      T* out = od + (i0 + i) * d.q_row() + bh * D;
      const bool none = l[i] == T(0);
      const T inv = none ? T(0) : T(1) / l[i];
      for (int64_t e = 0; e < D; e++) out[e] = acc[i * D + e] * inv;
      ld[bh * d.Sq + i0 + i] = none ? -std::numeric_limits<T>::infinity() : m[i] + std::log(l[i]);
    }
  }
}

template <typename T, bool R>
void forward_t(const Tensor& q, const Tensor& k, const Tensor& v, int64_t q0, int64_t k0, double scale, Tensor& o,
               Tensor& lse, const AttentionDropout* drop) {
  const BlockDims d = block_dims(q, k, v, q0, k0);
  MOE_ASSERT(o.shape() == q.shape() && o.dtype() == q.dtype());
  MOE_ASSERT_SHAPE(lse, {d.B, d.Nq, d.Sq});
  Tensor kt = Tensor::empty({d.B * d.Nkv * d.ktiles() * d.D * Bt}, q.dtype());
  pack_t<T, R>(d, k.data<T>(), kt.data<T>());
  Scratch<T> scratch(3 * Bt * d.D + Bt * Bt + 3 * Bt, q.dtype());
  const T *qd = q.data<T>(), *ktd = kt.data<T>(), *vd = v.data<T>();
  T *od = o.data<T>(), *ld = lse.data<T>();
#pragma omp parallel
  MOE_CPU_CLONES(forward_tiles<T, R>(d, qd, ktd, vd, T(scale), od, ld, drop, scratch));
}

template <typename T>
void merge_t(Tensor& o, Tensor& lse, const Tensor& o2, const Tensor& lse2) {
  MOE_ASSERT(o.ndim() == 4 && o.shape() == o2.shape() && lse.shape() == lse2.shape());
  MOE_ASSERT(o.dtype() == o2.dtype() && lse.dtype() == o.dtype() && lse2.dtype() == o.dtype());
  const int64_t S = o.dim(0), BN = o.dim(1) * o.dim(2), D = o.dim(3);
  MOE_ASSERT_SHAPE(lse, {o.dim(1), o.dim(2), S});
  T* od = o.data<T>();
  T* ld = lse.data<T>();
  const T* o2d = o2.data<T>();
  const T* l2d = lse2.data<T>();
  constexpr T kNegInf = -std::numeric_limits<T>::infinity();
#pragma omp parallel for schedule(static)
  for (int64_t s = 0; s < S; s++)
    for (int64_t bn = 0; bn < BN; bn++) {
      const T l1 = ld[bn * S + s], l2 = l2d[bn * S + s];
      if (l2 == kNegInf) continue;
      T* a = od + (s * BN + bn) * D;
      const T* c = o2d + (s * BN + bn) * D;
      if (l1 == kNegInf) {
        std::copy_n(c, D, a);
        ld[bn * S + s] = l2;
        continue;
      }
      const T mx = std::max(l1, l2), w1 = std::exp(l1 - mx), w2 = std::exp(l2 - mx), sum = w1 + w2;
      const T c1 = w1 / sum, c2 = w2 / sum;
      for (int64_t e = 0; e < D; e++) a[e] = c1 * a[e] + c2 * c[e];
      ld[bn * S + s] = mx + std::log(sum);
    }
}

template <typename T>
struct BwdCtx {
  BlockDims d;
  const T *q, *k, *dout, *lse, *delta, *kt, *vt;
  T scale;
  const AttentionDropout* drop;
};

// P (into w.sc, times the dropout multipliers) and dS (into w.dp) of query tile qt of head bh against key tile kt;
// w.q (scaled q̂) and w.dout hold the query tile's rows. Masked entries are 0.
template <typename T, bool R>
MOE_ALWAYS_INLINE void probs(const BwdCtx<T>& a, int64_t bh, int64_t qt, int64_t kt, BackwardTiles<T>& w) {
  constexpr int64_t L = Vec<T>::kLanes;
  const BlockDims& d = a.d;
  const int64_t D = d.D, b = bh / d.Nq, h = bh % d.Nq, bg = b * d.Nkv + h / d.group();
  const int64_t i0 = qt * Bt, nr = std::min(Bt, d.Sq - i0), j0 = kt * Bt, nc = std::min(Bt, d.Sk - j0);
  const int64_t N = (nc + L - 1) / L * L, nkt = d.ktiles();
  flash::block_gemm<T>(nr, N, D, MatA<T>{w.q, D, 1}, MatB<T>{a.kt + (bg * nkt + kt) * D * Bt, Bt}, MatC<T>{w.sc, Bt},
                       false, Causal::Full);
  flash::block_gemm<T>(nr, N, D, MatA<T>{w.dout, D, 1}, MatB<T>{a.vt + (bg * nkt + kt) * D * Bt, Bt}, MatC<T>{w.dp, Bt},
                       false, Causal::Full);
  for (int64_t i = 0; i < nr; i++) {
    const int64_t jmax = d.visible(i0 + i, j0, nc);
    const T li = a.lse[bh * d.Sq + i0 + i], dl = a.delta[bh * d.Sq + i0 + i];
    T* s = w.sc + i * Bt;
    T* g = w.dp + i * Bt;
    if (jmax > 0 && a.drop) a.drop->row(b, h, i0 + i, j0, jmax, w.z);
    flash::softmax_backward_row(s, g, T(1), li, dl, a.drop ? w.z : nullptr, jmax, s, g, [](T x) { return rnd<R>(x); });
    for (int64_t j = jmax; j < Bt; j++) s[j] = g[j] = 0;
  }
}

// Δ [B·Nq, Sq] of dout and o, shared among the calling team.
template <typename T>
MOE_ALWAYS_INLINE void delta_rows(const BlockDims& d, const T* od, const T* dod, T* dl) {
  const int64_t D = d.D;
#pragma omp for schedule(static)
  for (int64_t r = 0; r < d.B * d.Nq; r++)
    for (int64_t i = 0; i < d.Sq; i++) {
      const int64_t off = i * d.q_row() + r * D;
      T s = 0;
#pragma omp simd reduction(+ : s)
      for (int64_t e = 0; e < D; e++) s += dod[off + e] * od[off + e];
      dl[r * d.Sq + i] = s;
    }
}

// backward_t's tiles, shared among the calling team.
template <typename T, bool R>
MOE_ALWAYS_INLINE void backward_tiles(const BwdCtx<T>& a, T* dkd, T* dvd, T* dqd, Scratch<T>& scratch) {
  const BlockDims& d = a.d;
  const int64_t D = d.D, nqt = d.qtiles(), nkt = d.ktiles(), q_pairs = d.B * d.Nq, kv_pairs = d.B * d.Nkv;
  // dK, dV per (key tile, b, kv head).
#pragma omp for schedule(dynamic, 1)
  for (int64_t it = 0; it < kv_pairs * nkt; it++) {
    BackwardTiles<T> w(scratch.mine(), D);
    const int64_t t = it / kv_pairs, bg = it % kv_pairs, b = bg / d.Nkv, g = bg % d.Nkv;
    const int64_t j0 = t * Bt, nc = std::min(Bt, d.Sk - j0);
    std::fill_n(w.dK, nc * D, T(0));
    std::fill_n(w.dV, nc * D, T(0));
    for (int64_t h = g * d.group(); h < (g + 1) * d.group(); h++) {
      const int64_t bh = b * d.Nq + h;
      for (int64_t qt = 0; qt < nqt; qt++) {
        if (!d.any(qt, t)) continue;
        const int64_t i0 = qt * Bt, nr = std::min(Bt, d.Sq - i0);
        rows<T, R>(a.q, d.q_row(), bh, i0, nr, D, a.scale, w.q);
        rows<T, R>(a.dout, d.q_row(), bh, i0, nr, D, T(1), w.dout);
        probs<T, R>(a, bh, qt, t, w);
        flash::block_gemm<T>(nc, D, nr, MatA<T>{w.sc, 1, Bt}, MatB<T>{w.dout, D}, MatC<T>{w.dV, D}, true);
        flash::block_gemm<T>(nc, D, nr, MatA<T>{w.dp, 1, Bt}, MatB<T>{w.q, D}, MatC<T>{w.dK, D}, true);
      }
    }
    for (int64_t j = 0; j < nc; j++) {
      T* dkr = dkd + (j0 + j) * d.kv_row() + bg * D;
      T* dvr = dvd + (j0 + j) * d.kv_row() + bg * D;
      for (int64_t e = 0; e < D; e++) {
        dkr[e] = w.dK[j * D + e];  // q̂ carried the scale
        dvr[e] = w.dV[j * D + e];
      }
    }
  }
  // dQ per (query tile, b, head).
#pragma omp for schedule(dynamic, 1)
  for (int64_t it = 0; it < q_pairs * nqt; it++) {
    BackwardTiles<T> w(scratch.mine(), D);
    const int64_t qt = nqt - 1 - it / q_pairs, bh = it % q_pairs, b = bh / d.Nq, h = bh % d.Nq;
    const int64_t bg = b * d.Nkv + h / d.group(), i0 = qt * Bt, nr = std::min(Bt, d.Sq - i0);
    rows<T, R>(a.q, d.q_row(), bh, i0, nr, D, a.scale, w.q);
    rows<T, R>(a.dout, d.q_row(), bh, i0, nr, D, T(1), w.dout);
    std::fill_n(w.dK, nr * D, T(0));
    for (int64_t t = 0; t < nkt && d.any(qt, t); t++) {
      const int64_t j0 = t * Bt, nc = std::min(Bt, d.Sk - j0);
      probs<T, R>(a, bh, qt, t, w);
      rows<T, R>(a.k, d.kv_row(), bg, j0, nc, D, T(1), w.k);
      flash::block_gemm<T>(nr, D, nc, MatA<T>{w.dp, Bt, 1}, MatB<T>{w.k, D}, MatC<T>{w.dK, D}, true);
    }
    for (int64_t i = 0; i < nr; i++) {
      T* r = dqd + (i0 + i) * d.q_row() + bh * D;
      for (int64_t e = 0; e < D; e++) r[e] += w.dK[i * D + e] * a.scale;
    }
  }
}

template <typename T, bool R>
void backward_t(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                const Tensor& lse, int64_t q0, int64_t k0, double scale, Tensor& dq, Tensor& dk, Tensor& dv,
                const AttentionDropout* drop) {
  const BlockDims d = block_dims(q, k, v, q0, k0);
  MOE_ASSERT(dout.shape() == q.shape() && o.shape() == q.shape() && dq.shape() == q.shape());
  MOE_ASSERT(dk.shape() == k.shape() && dv.shape() == v.shape());
  MOE_ASSERT_SHAPE(lse, {d.B, d.Nq, d.Sq});
  const int64_t D = d.D, nkt = d.ktiles(), kv_pairs = d.B * d.Nkv;
  const DType dt = q.dtype();
  Tensor delta = Tensor::empty({d.B * d.Nq, d.Sq}, dt);
  const T *od = o.data<T>(), *dod = dout.data<T>();
  T* dl = delta.data<T>();
#pragma omp parallel
  MOE_CPU_CLONES(delta_rows<T>(d, od, dod, dl));
  Tensor kt = Tensor::empty({kv_pairs * nkt * D * Bt}, dt), vt = Tensor::empty({kv_pairs * nkt * D * Bt}, dt);
  pack_t<T, R>(d, k.data<T>(), kt.data<T>());
  pack_t<T, R>(d, v.data<T>(), vt.data<T>());
  const BwdCtx<T> a{
      d,        q.data<T>(), k.data<T>(), dout.data<T>(), lse.data<T>(), delta.data<T>(), kt.data<T>(), vt.data<T>(),
      T(scale), drop};
  Scratch<T> scratch(BackwardTiles<T>::size(D), dt);
  T *dkd = dk.data<T>(), *dvd = dv.data<T>(), *dqd = dq.data<T>();
#pragma omp parallel
  MOE_CPU_CLONES(backward_tiles<T, R>(a, dkd, dvd, dqd, scratch));
}

void require_f32(const Tensor& q) {
  MOE_ASSERT_MSG(q.dtype() == DType::F32, "bf16 attention takes f32 tensors (rounded to bf16 inside), got {}",
                 dtype_name(q.dtype()));
}

// The dropout of the block at (q0, k0) (`shifted`, kept in `storage`), or null when there is none.
const AttentionDropout* shifted_or_null(const AttentionDropout* dropout, int64_t q0, int64_t k0,
                                        AttentionDropout& storage) {
  if (!dropout || !dropout->on()) return nullptr;
  storage = shifted(dropout, q0, k0);
  return &storage;
}

}  // namespace flash_block

namespace flash {
void block_forward_rounded(const Tensor& q, const Tensor& k, const Tensor& v, int64_t q0, int64_t k0, double scale,
                           Tensor& o, Tensor& lse, const AttentionDropout* dropout) {
  AttentionDropout drop;
  flash_block::require_f32(q);
  flash_block::forward_t<float, true>(q, k, v, q0, k0, scale, o, lse,
                                      flash_block::shifted_or_null(dropout, q0, k0, drop));
}

void block_backward_rounded(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                            const Tensor& lse, int64_t q0, int64_t k0, double scale, Tensor& dq, Tensor& dk, Tensor& dv,
                            const AttentionDropout* dropout) {
  AttentionDropout drop;
  flash_block::require_f32(q);
  flash_block::backward_t<float, true>(dout, q, k, v, o, lse, q0, k0, scale, dq, dk, dv,
                                       flash_block::shifted_or_null(dropout, q0, k0, drop));
}
}  // namespace flash

// The CPU backend's block ops (attention_flash.h), in its table (kernels/cpu/attention.cpp).
void cpu::attention_block_forward(const Tensor& q, const Tensor& k, const Tensor& v, int64_t q0, int64_t k0,
                                  double scale, Tensor& o, Tensor& lse, const AttentionDropout* dropout,
                                  bool round_bf16) {
  AttentionDropout drop;
  const AttentionDropout* dp = flash_block::shifted_or_null(dropout, q0, k0, drop);
  if (round_bf16 && bf16_attention_kernel() == Bf16AttentionKernel::FlashNative)
    return flash::block_forward_native(q, k, v, q0, k0, scale, o, lse, dp, flash::best_native_bf16());
  if (round_bf16) return flash::block_forward_rounded(q, k, v, q0, k0, scale, o, lse, dropout);
  MOE_DISPATCH_FLOAT(q.dtype(), T, { flash_block::forward_t<T, false>(q, k, v, q0, k0, scale, o, lse, dp); });
}

void cpu::attention_merge(Tensor& o, Tensor& lse, const Tensor& o_part, const Tensor& lse_part) {
  MOE_DISPATCH_FLOAT(o.dtype(), T, { flash_block::merge_t<T>(o, lse, o_part, lse_part); });
}

void cpu::attention_block_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                                   const Tensor& o, const Tensor& lse, int64_t q0, int64_t k0, double scale, Tensor& dq,
                                   Tensor& dk, Tensor& dv, const AttentionDropout* dropout, bool round_bf16) {
  AttentionDropout drop;
  const AttentionDropout* dp = flash_block::shifted_or_null(dropout, q0, k0, drop);
  if (round_bf16 && bf16_attention_kernel() == Bf16AttentionKernel::FlashNative)
    return flash::block_backward_native(dout, q, k, v, o, lse, q0, k0, scale, dq, dk, dv, dp,
                                        flash::best_native_bf16());
  if (round_bf16) return flash::block_backward_rounded(dout, q, k, v, o, lse, q0, k0, scale, dq, dk, dv, dropout);
  MOE_DISPATCH_FLOAT(q.dtype(), T,
                     { flash_block::backward_t<T, false>(dout, q, k, v, o, lse, q0, k0, scale, dq, dk, dv, dp); });
}

}  // namespace moecore::kernels
