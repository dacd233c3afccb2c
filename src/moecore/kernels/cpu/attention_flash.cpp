// FlashAttention-2-style causal GQA attention on the CPU (see attention_flash.h, attention.h).
//
// Tiles of kAttnTile queries × kAttnTile keys. Every product is a register-blocked block GEMM (attention_blocks.h):
//   forward, per (b, h, query tile), over key tiles up to the diagonal, with Q̂ = scale·Q:
//     S = Q̂·Kᵀ;  m' = max(m, rowmax S);  P = exp(S − m');  l = e^(m−m')·l + rowsum P;  O = e^(m−m')·O + P·V
//     finally O /= l, lse = m + log l
//   backward, with P = exp(scale·Q·Kᵀ − lse) recomputed and Δ_i = Σ_d dO_id·O_id:
//     dP = dO·Vᵀ;  dS = P ⊙ (dP − Δ);  dV += Pᵀ·dO;  dK += dSᵀ·Q (× scale);  dQ += dS·K (× scale)
// Tiles above the diagonal are skipped; on a diagonal tile the scores right of a row block's last row and the
// zero terms of the causal products are not computed (attention_blocks.h, Causal). K (and V for backward) are
// transposed once per call into [B·Nkv, D, S] so that the key dimension is contiguous; a query head reads the
// transposed copy of its kv head, never a per-head copy.
// Attention dropout (multipliers Z regenerated per row and key tile): O sums (P ⊙ Z)·V while l sums the undropped
// P; backward dV = (P ⊙ Z)ᵀ·dO and dS = P ⊙ (Z ⊙ dP − Δ).
// Backward runs either fused (one item per (b, kv head): dK, dV tile by tile, dQ accumulated in place) or in two
// passes (dK, dV per key tile; dQ per query tile) when there are too few kv heads to keep the threads busy. Both
// add every dQ, dK, dV term in the same order (dQ over key tiles ascending, dK/dV over query heads then query
// tiles), so the two give identical bits, and each output element has exactly one writer: no atomics.
// round_bf16 (f32 only) rounds scale·q, k, v, dout, P and dS to bf16 before their products (attention.h).
#include "moecore/kernels/cpu/attention_flash.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "moecore/core/allocator.h"
#include "moecore/core/cpu.h"
#include "moecore/kernels/cpu/attention_blocks.h"
#include "moecore/kernels/cpu/vec_math.h"

namespace moecore::kernels::flash {

namespace {

constexpr int64_t Bt = kAttnTile;

template <bool R, typename T>
MOE_ALWAYS_INLINE T rnd(T x) {
  if constexpr (R && std::is_same_v<T, float>)
    return bf16_to_float(float_to_bf16(x));
  else
    return x;
}

int64_t padded_seq(const AttentionDims& d) {
  return d.ntiles() * Bt;
}

// dst [heads, tiles, D, Bt] ← each key tile of each head of src transposed (zero past S), rounded when R. A tile
// is one contiguous block, so a product's rows of B sit in consecutive cache lines (rows S apart would all fall
// into the same few L1 sets).
template <typename T, bool R>
MOE_ALWAYS_INLINE void pack_transposed_body(const AttentionDims& d, Heads<T> src, int64_t heads, T* dst) {
  const int64_t D = d.D, nt = d.ntiles();
#pragma omp for schedule(static) collapse(2)
  for (int64_t bn = 0; bn < heads; bn++)
    for (int64_t t = 0; t < nt; t++) {
      T* out = dst + (bn * nt + t) * D * Bt;
      for (int64_t j = 0; j < Bt; j++) {
        const int64_t s = t * Bt + j;
        if (s >= d.S) {
          for (int64_t e = 0; e < D; e++) out[e * Bt + j] = T(0);
          continue;
        }
        const T* in = src.at(bn, s);
        for (int64_t e = 0; e < D; e++) out[e * Bt + j] = rnd<R>(in[e]);
      }
    }
}
template <typename T, bool R>
void pack_transposed(const AttentionDims& d, Heads<T> src, int64_t heads, T* dst) {
#pragma omp parallel
  MOE_CPU_CLONES(pack_transposed_body<T, R>(d, src, heads, dst));
}

// The transposed key tile kt of head pair bg (see pack_transposed), as a block GEMM operand.
template <typename T>
MOE_ALWAYS_INLINE MatB<T> tile_t(const T* packed, const AttentionDims& d, int64_t bg, int64_t kt) {
  return {packed + (bg * d.ntiles() + kt) * d.D * Bt, Bt};
}

// dst [n, D] ← rows s0..s0+n of head bn of src (dense, so a product's operand rows are consecutive cache lines).
template <typename T>
MOE_ALWAYS_INLINE void copy_rows(Heads<T> src, int64_t bn, int64_t s0, int64_t n, int64_t D, T* dst) {
  for (int64_t i = 0; i < n; i++) std::copy_n(src.at(bn, s0 + i), D, dst + i * D);
}

// dst [heads, S, D] ← rnd(mul · rows of each head of src), rounded when R.
template <typename T, bool R>
MOE_ALWAYS_INLINE void pack_rows_body(const AttentionDims& d, Heads<T> src, int64_t heads, T mul, T* dst) {
  const int64_t D = d.D;
#pragma omp for schedule(static) collapse(2)
  for (int64_t bn = 0; bn < heads; bn++)
    for (int64_t s = 0; s < d.S; s++) {
      const T* in = src.at(bn, s);
      T* out = dst + (bn * d.S + s) * D;
#pragma omp simd
      for (int64_t e = 0; e < D; e++) out[e] = rnd<R>(in[e] * mul);
    }
}
template <typename T, bool R>
void pack_rows(const AttentionDims& d, Heads<T> src, int64_t heads, T mul, T* dst) {
#pragma omp parallel
  MOE_CPU_CLONES(pack_rows_body<T, R>(d, src, heads, mul, dst));
}

template <typename T>
struct FwdArgs {
  AttentionDims d;
  const T* q;   // [S, B, Nq, D]
  const T* kt;  // [B·Nkv, tiles, D, Bt]
  Heads<T> v;   // packed [B·Nkv, S, D]
  T scale;
  T* o;
  T* lse;
  const AttentionDropout* drop;
};

template <typename T, bool R>
MOE_ALWAYS_INLINE void forward_impl_body(const FwdArgs<T>& a, Scratch<T>& scratch) {
  using flash::Causal;
  constexpr int64_t L = Vec<T>::kLanes;
  const AttentionDims& d = a.d;
  const int64_t S = d.S, D = d.D, nt = d.ntiles(), pairs = d.B * d.Nq;
  _Pragma("omp for schedule(dynamic, 1)") for (int64_t it = 0; it < pairs * nt; it++) {
    const int64_t qt = nt - 1 - it / pairs, bh = it % pairs;  // longest rows of tiles first
    const int64_t b = bh / d.Nq, h = bh % d.Nq, bg = b * d.Nkv + h / d.group();
    T* Qs = scratch.mine();  // [Bt, D]
    T* acc = Qs + Bt * D;    // [Bt, D]
    T* sc = acc + Bt * D;    // [Bt, Bt] scores, then probabilities
    T* m = sc + Bt * Bt;     // [Bt]
    T* l = m + Bt;           // [Bt]
    T* z = l + Bt;           // [Bt] dropout multipliers
    const int64_t i0 = qt * Bt, nr = std::min(Bt, S - i0);
    for (int64_t i = 0; i < nr; i++) {
      const T* src = a.q + (i0 + i) * d.q_row() + bh * D;
      for (int64_t e = 0; e < D; e++) Qs[i * D + e] = rnd<R>(src[e] * a.scale);
      m[i] = -std::numeric_limits<T>::infinity();
      l[i] = 0;
    }
    std::fill_n(acc, nr * D, T(0));
    for (int64_t kt = 0; kt <= qt; kt++) {
      const int64_t j0 = kt * Bt, nc = std::min(Bt, S - j0);
      const bool diag = kt == qt;
      block_gemm<T>(nr, (nc + L - 1) / L * L, D, MatA<T>{Qs, D, 1}, tile_t(a.kt, d, bg, kt), MatC<T>{sc, Bt}, false,
                    diag ? Causal::ColsUpToRow : Causal::Full);
      for (int64_t i = 0; i < nr; i++) {
        const int64_t jmax = diag ? std::min(nc, i + 1) : nc;  // visible keys of row i
        T* s = sc + i * Bt;
        const T alpha = online_softmax_row(s, jmax, m[i], l[i], z, [&](T* zr) {
          if (a.drop) a.drop->row(b, h, i0 + i, j0, jmax, zr);
          return a.drop != nullptr;
        });
        if constexpr (R) {
#pragma omp simd
          for (int64_t j = 0; j < jmax; j++) s[j] = rnd<R>(s[j]);
        }
        for (int64_t j = jmax; j < nc; j++) s[j] = 0;
        if (alpha != T(1)) {
          T* ar = acc + i * D;
#pragma omp simd
          for (int64_t e = 0; e < D; e++) ar[e] *= alpha;
        }
      }
      block_gemm<T>(nr, D, nc, MatA<T>{sc, Bt, 1}, MatB<T>{a.v.at(bg, j0), a.v.ld}, MatC<T>{acc, D}, true,
                    diag ? Causal::KUpToRow : Causal::Full);
    }
    for (int64_t i = 0; i < nr; i++) {
      T* out = a.o + (i0 + i) * d.q_row() + bh * D;
      const T inv = T(1) / l[i];
#pragma omp simd
      for (int64_t e = 0; e < D; e++) out[e] = acc[i * D + e] * inv;
      a.lse[bh * S + i0 + i] = m[i] + std::log(l[i]);
    }
  }
}
template <typename T, bool R>
void forward_impl(const FwdArgs<T>& a, Scratch<T>& scratch) {
#pragma omp parallel
  MOE_CPU_CLONES(forward_impl_body<T, R>(a, scratch));
}

template <typename T>
struct BwdArgs {
  AttentionDims d;
  Heads<T> q, k, dout;  // q carries `scale` already when score_mul is 1
  const T* kt;          // [B·Nkv, tiles, D, Bt]
  const T* vt;          // [B·Nkv, tiles, D, Bt]
  const T *lse, *delta;
  T *dq, *dk, *dv;
  T score_mul, dk_mul, dq_mul;
  const AttentionDropout* drop;
};

// One (query tile, key tile) pair of head h: recomputes P and dS, then adds into the dK/dV tiles (when kv) and into
// dQ's rows in place (when dq).
template <typename T, bool R>
MOE_ALWAYS_INLINE void backward_pair(const BwdArgs<T>& a, int64_t b, int64_t h, int64_t qt, int64_t kt,
                                     BackwardTiles<T>& w, bool kv, bool dq) {
  constexpr int64_t L = Vec<T>::kLanes;
  const AttentionDims& d = a.d;
  const int64_t S = d.S, D = d.D;
  const int64_t bh = b * d.Nq + h, bg = b * d.Nkv + h / d.group();
  const int64_t i0 = qt * Bt, nr = std::min(Bt, S - i0), j0 = kt * Bt, nc = std::min(Bt, S - j0);
  const bool diag = qt == kt;
  const Causal cols = diag ? Causal::ColsUpToRow : Causal::Full;
  const int64_t N = (nc + L - 1) / L * L;
  copy_rows(a.q, bh, i0, nr, D, w.q);
  copy_rows(a.dout, bh, i0, nr, D, w.dout);
  block_gemm<T>(nr, N, D, MatA<T>{w.q, D, 1}, tile_t(a.kt, d, bg, kt), MatC<T>{w.sc, Bt}, false, cols);
  block_gemm<T>(nr, N, D, MatA<T>{w.dout, D, 1}, tile_t(a.vt, d, bg, kt), MatC<T>{w.dp, Bt}, false, cols);
  for (int64_t i = 0; i < nr; i++) {
    const int64_t jmax = diag ? std::min(nc, i + 1) : nc;
    T* s = w.sc + i * Bt;
    T* g = w.dp + i * Bt;
    if (a.drop) a.drop->row(b, h, i0 + i, j0, jmax, w.z);
    softmax_backward_row(s, g, a.score_mul, a.lse[bh * S + i0 + i], a.delta[bh * S + i0 + i], a.drop ? w.z : nullptr,
                         jmax, s, g, [](T x) { return rnd<R>(x); });
    for (int64_t j = jmax; j < nc; j++) s[j] = g[j] = 0;
  }
  if (kv) {
    const Causal from = diag ? Causal::KFromRow : Causal::Full;
    block_gemm<T>(nc, D, nr, MatA<T>{w.sc, 1, Bt}, MatB<T>{w.dout, D}, MatC<T>{w.dV, D}, true, from);
    block_gemm<T>(nc, D, nr, MatA<T>{w.dp, 1, Bt}, MatB<T>{w.q, D}, MatC<T>{w.dK, D}, true, from);
  }
  if (dq) {
    copy_rows(a.k, bg, j0, nc, D, w.k);
    block_gemm<T>(nr, D, nc, MatA<T>{w.dp, Bt, 1}, MatB<T>{w.k, D}, MatC<T>{a.dq + i0 * d.q_row() + bh * D, d.q_row()},
                  true, diag ? Causal::KUpToRow : Causal::Full);
  }
}

// dK and dV of key tile kt of kv head (b, g): the sum over the group's query heads and the query tiles from kt on.
// With dq, also adds every pair's dQ terms in place.
template <typename T, bool R>
MOE_ALWAYS_INLINE void key_tile(const BwdArgs<T>& a, int64_t b, int64_t g, int64_t kt, BackwardTiles<T>& w, bool dq) {
  const AttentionDims& d = a.d;
  const int64_t D = d.D, j0 = kt * Bt, nc = std::min(Bt, d.S - j0), bg = b * d.Nkv + g;
  std::fill_n(w.dK, nc * D, T(0));
  std::fill_n(w.dV, nc * D, T(0));
  for (int64_t h = g * d.group(); h < (g + 1) * d.group(); h++)
    for (int64_t qt = kt; qt < d.ntiles(); qt++) backward_pair<T, R>(a, b, h, qt, kt, w, true, dq);
  for (int64_t j = 0; j < nc; j++) {
    T* dkr = a.dk + (j0 + j) * d.kv_row() + bg * D;
    T* dvr = a.dv + (j0 + j) * d.kv_row() + bg * D;
#pragma omp simd
    for (int64_t e = 0; e < D; e++) {
      dkr[e] = w.dK[j * D + e] * a.dk_mul;
      dvr[e] = w.dV[j * D + e];
    }
  }
}

// Rows [i0, i0+n) of head bh of dQ: zeroed (before the sum) or multiplied by dq_mul (after it).
template <typename T>
MOE_ALWAYS_INLINE void dq_rows(const BwdArgs<T>& a, int64_t bh, int64_t i0, int64_t n, bool zero) {
  const int64_t D = a.d.D;
  for (int64_t i = i0; i < i0 + n; i++) {
    T* r = a.dq + i * a.d.q_row() + bh * D;
#pragma omp simd
    for (int64_t e = 0; e < D; e++) r[e] = zero ? T(0) : r[e] * a.dq_mul;
  }
}

// Fused: one item per (b, kv head) does everything for its heads.
template <typename T, bool R>
MOE_ALWAYS_INLINE void backward_fused_body(const BwdArgs<T>& a, Scratch<T>& scratch) {
  const AttentionDims& d = a.d;
  _Pragma("omp for schedule(dynamic, 1)") for (int64_t bg = 0; bg < d.B * d.Nkv; bg++) {
    const int64_t b = bg / d.Nkv, g = bg % d.Nkv;
    BackwardTiles<T> w(scratch.mine(), d.D);
    for (int64_t h = g * d.group(); h < (g + 1) * d.group(); h++) dq_rows(a, b * d.Nq + h, 0, d.S, true);
    for (int64_t kt = 0; kt < d.ntiles(); kt++) key_tile<T, R>(a, b, g, kt, w, true);
    for (int64_t h = g * d.group(); h < (g + 1) * d.group(); h++) dq_rows(a, b * d.Nq + h, 0, d.S, false);
  }
}
template <typename T, bool R>
void backward_fused(const BwdArgs<T>& a, Scratch<T>& scratch) {
#pragma omp parallel
  MOE_CPU_CLONES(backward_fused_body<T, R>(a, scratch));
}

// Two passes: dK, dV per (key tile, b, kv head), longest first; then dQ per (query tile, b, head).
template <typename T, bool R>
MOE_ALWAYS_INLINE void backward_two_pass_body(const BwdArgs<T>& a, Scratch<T>& scratch) {
  const AttentionDims& d = a.d;
  const int64_t nt = d.ntiles(), kv_pairs = d.B * d.Nkv, q_pairs = d.B * d.Nq;
  _Pragma("omp for schedule(dynamic, 1)") for (int64_t it = 0; it < kv_pairs * nt; it++) {
    BackwardTiles<T> w(scratch.mine(), d.D);
    const int64_t bg = it % kv_pairs;
    key_tile<T, R>(a, bg / d.Nkv, bg % d.Nkv, it / kv_pairs, w, false);
  }
  _Pragma("omp for schedule(dynamic, 1)") for (int64_t it = 0; it < q_pairs * nt; it++) {
    BackwardTiles<T> w(scratch.mine(), d.D);
    const int64_t qt = nt - 1 - it / q_pairs, bh = it % q_pairs, i0 = qt * Bt;
    const int64_t b = bh / d.Nq, h = bh % d.Nq, n = std::min(Bt, d.S - i0);
    dq_rows(a, bh, i0, n, true);
    for (int64_t kt = 0; kt <= qt; kt++) backward_pair<T, R>(a, b, h, qt, kt, w, false, true);
    dq_rows(a, bh, i0, n, false);
  }
}
template <typename T, bool R>
void backward_two_pass(const BwdArgs<T>& a, Scratch<T>& scratch) {
#pragma omp parallel
  MOE_CPU_CLONES(backward_two_pass_body<T, R>(a, scratch));
}

template <typename T, bool R>
void backward_t(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                const Tensor& lse, double scale, Tensor& dq, Tensor& dk, Tensor& dv, const AttentionDropout* dropout) {
  const AttentionDims d = attention_backward_dims(dout, q, k, v, o, lse, dq, dk, dv);
  const int64_t kv_pairs = d.B * d.Nkv, q_pairs = d.B * d.Nq, Sp = padded_seq(d);  // Kᵀ, Vᵀ: [pairs, D, Sp]
  const DType dt = q.dtype();
  Tensor delta = Tensor::empty({q_pairs, d.S}, dt);
  {
    const T* od = o.data<T>();
    const T* dod = dout.data<T>();
    T* dl = delta.data<T>();
    _Pragma("omp parallel for schedule(static)") for (int64_t r = 0; r < q_pairs; r++) {
      for (int64_t i = 0; i < d.S; i++) {
        const int64_t off = i * d.q_row() + r * d.D;  // r = b·Nq + h matches the [S, B, Nq, D] layout
        T s = 0;
        for (int64_t e = 0; e < d.D; e++) s += dod[off + e] * od[off + e];
        dl[r * d.S + i] = s;
      }
    }
  }
  Tensor kt = Tensor::empty({kv_pairs * d.D * Sp}, dt), vt = Tensor::empty({kv_pairs * d.D * Sp}, dt);
  pack_transposed<T, R>(d, heads_of(k.data<T>(), d, d.Nkv), kv_pairs, kt.data<T>());
  pack_transposed<T, R>(d, heads_of(v.data<T>(), d, d.Nkv), kv_pairs, vt.data<T>());
  BwdArgs<T> a{d,
               heads_of(q.data<T>(), d, d.Nq),
               heads_of(k.data<T>(), d, d.Nkv),
               heads_of(dout.data<T>(), d, d.Nq),
               kt.data<T>(),
               vt.data<T>(),
               lse.data<T>(),
               delta.data<T>(),
               dq.data<T>(),
               dk.data<T>(),
               dv.data<T>(),
               T(scale),
               T(scale),
               T(scale),
               dropout};
  Tensor qh, kh, doh;  // bf16 operands, packed [heads, S, D]
  if constexpr (R) {
    qh = Tensor::empty({q_pairs * d.S * d.D}, dt);
    kh = Tensor::empty({kv_pairs * d.S * d.D}, dt);
    doh = Tensor::empty({q_pairs * d.S * d.D}, dt);
    pack_rows<float, true>(d, a.q, q_pairs, static_cast<float>(scale), qh.data<float>());
    pack_rows<float, true>(d, a.k, kv_pairs, 1.0f, kh.data<float>());
    pack_rows<float, true>(d, a.dout, q_pairs, 1.0f, doh.data<float>());
    a.q = {qh.data<float>(), d.S * d.D, d.D};
    a.k = {kh.data<float>(), d.S * d.D, d.D};
    a.dout = {doh.data<float>(), d.S * d.D, d.D};
    a.score_mul = a.dk_mul = 1;  // q̂ carries the scale
  }
  Scratch<T> scratch(BackwardTiles<T>::size(d.D), dt);
  if (use_fused(d))
    backward_fused<T, R>(a, scratch);
  else
    backward_two_pass<T, R>(a, scratch);
}

template <typename T, bool R>
void forward_t(const Tensor& q, const Tensor& k, const Tensor& v, double scale, Tensor& o, Tensor& lse,
               const AttentionDropout* dropout) {
  const AttentionDims d = attention_forward_dims(q, k, v, o, lse);
  const int64_t kv_pairs = d.B * d.Nkv;
  Tensor kt = Tensor::empty({kv_pairs * d.D * padded_seq(d)}, q.dtype());
  pack_transposed<T, R>(d, heads_of(k.data<T>(), d, d.Nkv), kv_pairs, kt.data<T>());
  FwdArgs<T> a{d,        q.data<T>(), kt.data<T>(),  heads_of(v.data<T>(), d, d.Nkv),
               T(scale), o.data<T>(), lse.data<T>(), dropout};
  Tensor vh = Tensor::empty({kv_pairs * d.S * d.D}, q.dtype());
  pack_rows<T, R>(d, a.v, kv_pairs, T(1), vh.data<T>());
  a.v = {vh.data<T>(), d.S * d.D, d.D};
  Scratch<T> scratch(2 * Bt * d.D + Bt * Bt + 3 * Bt, q.dtype());
  forward_impl<T, R>(a, scratch);
}

void require_f32(const Tensor& q) {
  MOE_ASSERT_MSG(q.dtype() == DType::F32, "bf16 attention takes f32 tensors (rounded to bf16 inside), got {}",
                 dtype_name(q.dtype()));
}

}  // namespace

void forward(const Tensor& q, const Tensor& k, const Tensor& v, double scale, Tensor& o, Tensor& lse,
             const AttentionDropout* dropout, bool round_bf16) {
  if (dropout && !dropout->on()) dropout = nullptr;
  if (round_bf16) {
    require_f32(q);
    forward_t<float, true>(q, k, v, scale, o, lse, dropout);
    return;
  }
  MOE_DISPATCH_FLOAT(q.dtype(), T, { forward_t<T, false>(q, k, v, scale, o, lse, dropout); });
}

void backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o, const Tensor& lse,
              double scale, Tensor& dq, Tensor& dk, Tensor& dv, const AttentionDropout* dropout, bool round_bf16) {
  if (dropout && !dropout->on()) dropout = nullptr;
  if (round_bf16) {
    require_f32(q);
    backward_t<float, true>(dout, q, k, v, o, lse, scale, dq, dk, dv, dropout);
    return;
  }
  MOE_DISPATCH_FLOAT(q.dtype(), T, { backward_t<T, false>(dout, q, k, v, o, lse, scale, dq, dk, dv, dropout); });
}

int64_t backward_bytes(int64_t S, int64_t B, int64_t Nq, int64_t Nkv, int64_t D, bool round_bf16) {
  AttentionDims d{};
  d.S = S, d.B = B, d.Nq = Nq, d.Nkv = Nkv, d.D = D;
  const auto f32 = [](int64_t n) { return static_cast<int64_t>(Allocator::round_size(static_cast<size_t>(n) * 4)); };
  const int64_t q_pairs = B * Nq, kv_pairs = B * Nkv, scratch = (BackwardTiles<float>::size(D) + 15) / 16 * 16;
  // backward_t's buffers: Δ, Kᵀ and Vᵀ, the per-thread tiles and, rounding to bf16, the packed q̂, k and dout.
  const int64_t packed = round_bf16 ? 2 * f32(q_pairs * S * D) + f32(kv_pairs * S * D) : 0;
  return f32(q_pairs * S) + 2 * f32(kv_pairs * D * padded_seq(d)) + f32(num_threads() * scratch) + packed;
}

}  // namespace moecore::kernels::flash
