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
// order, so results are bitwise reproducible whatever the thread count. The softmax rows run in 16-lane vectors with
// their maxima and sums reduced in fixed trees (attention_native_softmax.h), and dropout's mask enters as bits
// (AttentionDropout::rows_bits: the multipliers' mask, compared in registers).
#include "moecore/kernels/cpu/attention_flash_native.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>

#include "moecore/core/allocator.h"
#include "moecore/kernels/cpu/amx_tiles.h"
#include "moecore/kernels/cpu/attention_native_parts.h"
#include "moecore/kernels/cpu/attention_native_softmax.h"
#include "moecore/kernels/cpu/vec_math.h"
#include "moecore/kernels/rope.h"

namespace moecore::kernels::flash {

namespace {

using NativeFwd = FwdCall<NativeDims>;

template <class G>
MOE_ALWAYS_INLINE void native_forward_items_body(const NativeFwd& a, Scratch<float>& scratch) {
  const AttentionDims& d = a.n.d;
  const int64_t S = d.S, D = d.D, Dp = a.n.Dp, nt = a.n.nt, pairs = d.B * d.Nq;
  _Pragma("omp for schedule(dynamic, 1)") for (int64_t it = 0; it < pairs * nt; it++) {
    const int64_t qt = nt - 1 - it / pairs, bh = it % pairs;  // longest rows of tiles first
    const int64_t b = bh / d.Nq, h = bh % d.Nq, bg = b * d.Nkv + h / d.group();
    const NativeFwdTiles w(scratch.mine(), Dp);
    float *acc = w.acc, *sc = w.sc, *m = w.m, *l = w.l, *row = w.row;
    bf16* P = w.P;
    const int64_t i0 = qt * kTn, nr = std::min(kTn, S - i0), M = round_up(nr, 16);
    const bf16* Qs = ptile(a.pk->qR, a.n, bh, qt);
    const DropoutMask head = a.drop ? a.drop->head_mask(h) : DropoutMask{};
    for (int64_t i = 0; i < M; i++) {
      m[i] = -std::numeric_limits<float>::infinity();
      l[i] = 0;
    }
    std::fill(P + nr * kTn, P + M * kTn, bf16{0});  // padding rows: native_softmax_rows writes the others whole
    G::begin();
    for (int64_t kt = 0; kt <= qt; kt++) {
      const int64_t j0 = kt * kTn, nc = std::min(kTn, S - j0);
      const bool diag = kt == qt;
      G::run({M, kTn, Dp, Qs, Dp, ptile(a.pk->kT, a.n, bg, kt), 2 * kTn, sc, kTn, false,
              diag ? Causal::ColsUpToRow : Causal::Full});
      static_assert(kTileRowsMax == 2, "query rows go through the softmax in pairs");
      for (int64_t i = 0; i < nr; i += 2) {
        const int64_t jmax[2] = {diag ? std::min(nc, i + 1) : nc, diag ? std::min(nc, i + 2) : nc};  // visible keys
        const int rows = i + 1 < nr ? 2 : 1;
        RowDrop rd[2];
        const RowDrop* drop[2];
        tile_rows_drop(a.drop, head, b, i0 + i, rows, j0, nc, rd, drop);
        float alpha[2];
        if (rows == 2)
          native_softmax_rows<2>(sc + i * kTn, jmax, m + i, l + i, drop, P + i * kTn, alpha);
        else
          native_softmax_rows<1>(sc + i * kTn, jmax, m + i, l + i, drop, P + i * kTn, alpha);
        for (int64_t r = i; r < std::min(i + 2, nr); r++)
          if (kt > 0 && alpha[r - i] != 1.0f) {  // at kt = 0 the product below stores acc
            float* ar = acc + r * Dp;
#pragma omp simd
            for (int64_t e = 0; e < Dp; e++) ar[e] *= alpha[r - i];
          }
      }
      G::run({M, Dp, kTn, P, kTn, ptile(a.pk->vN, a.n, bg, kt), 2 * Dp, acc, Dp, kt > 0,
              diag ? Causal::KUpToRow : Causal::Full});
    }
    G::end();
    for (int64_t i = 0; i < nr; i++) {
      store_row(acc + i * Dp, 1, 1.0f / l[i], nullptr, a.o, bh, i0 + i, D, row);
      a.lse[bh * S + i0 + i] = m[i] + std::log(l[i]);
    }
  }
}
template <class G>
void native_forward_items(const NativeFwd& a, Scratch<float>& scratch) {
#pragma omp parallel
  MOE_CPU_CLONES(native_forward_items_body<G>(a, scratch));
}

struct NativeBwd {
  NativeDims n;
  const BwdPacks* pk;
  const float *lse, *delta;
  float* dQacc;  // [B·Nq, Sp, Dp]
  NativeRows dq, dk, dv;
  float dq_mul;
  const AttentionDropout* drop;
  const NativeRope* rope;  // turned back on dq and dk as they are written
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
  G::run(
      {Mq, kTn, Dp, ptile(a.pk->qR, a.n, bh, qt), Dp, ptile(a.pk->kT, a.n, bg, kt), 2 * kTn, w.sc, kTn, false, cols});
  G::run(
      {Mq, kTn, Dp, ptile(a.pk->dR, a.n, bh, qt), Dp, ptile(a.pk->vT, a.n, bg, kt), 2 * kTn, w.dp, kTn, false, cols});
  const DropoutMask head = a.drop ? a.drop->head_mask(h) : DropoutMask{};
  for_tile_rows(a.drop, head, b, i0, nr, j0, nc, [&](int64_t i, const RowDrop* drop) {
    const int64_t jmax = diag ? std::min(nc, i + 1) : nc;
    native_softmax_backward_row(w.sc + i * kTn, w.dp + i * kTn, a.lse[bh * S + i0 + i], a.delta[bh * S + i0 + i], drop,
                                jmax, w.P + i * kTn, w.dS + i * kTn);
  });
  std::fill(w.P + nr * kTn, w.P + kTn * kTn, bf16{0});
  std::fill(w.dS + nr * kTn, w.dS + kTn * kTn, bf16{0});
  if (kv) {
    const Causal from = diag ? Causal::KFromCol : Causal::Full;
    row_pairs(w.P, w.Pp);
    row_pairs(w.dS, w.dSp);
    const bf16* Pp = reinterpret_cast<const bf16*>(w.Pp);
    const bf16* dSp = reinterpret_cast<const bf16*>(w.dSp);
    const bool first = qt == kt && h % d.group() == 0;  // the key tile's first pair stores dKᵀ, dVᵀ
    G::run({Dp, kTn, kTn, ptile(a.pk->dT, a.n, bh, qt), kTn, Pp, 2 * kTn, w.dVt, kTn, !first, from});
    G::run({Dp, kTn, kTn, ptile(a.pk->qT, a.n, bh, qt), kTn, dSp, 2 * kTn, w.dKt, kTn, !first, from});
  }
  if (dq)
    G::run({Mq, Dp, kTn, w.dS, kTn, ptile(a.pk->kN, a.n, bg, kt), 2 * Dp, a.dQacc + (bh * a.n.Sp + i0) * Dp, Dp, kt > 0,
            diag ? Causal::KUpToRow : Causal::Full});
}

// dK and dV of key tile kt of kv head (b, g): the sum over the group's query heads and the query tiles from kt on.
template <class G>
MOE_ALWAYS_INLINE void native_key_tile(const NativeBwd& a, int64_t b, int64_t g, int64_t kt, NativeTiles& w, bool dq) {
  const AttentionDims& d = a.n.d;
  const int64_t D = d.D, j0 = kt * kTn, nc = std::min(kTn, d.S - j0), bg = b * d.Nkv + g;
  for (int64_t h = g * d.group(); h < (g + 1) * d.group(); h++)
    for (int64_t qt = kt; qt < a.n.nt; qt++) native_pair<G>(a, b, h, qt, kt, w, true, dq);
  store_transposed_tile(w.dKt, a.n.Dp, a.rope, a.dk, bg, j0, nc, D, w.tr, w.row);
  store_transposed_tile(w.dVt, a.n.Dp, nullptr, a.dv, bg, j0, nc, D, w.tr, w.row);
}

// dQ rows [i0, i0+n) of head bh written out times dq_mul (their f32 sums start at each row's kt = 0 pair).
MOE_ALWAYS_INLINE void native_dq_rows(const NativeBwd& a, int64_t bh, int64_t i0, int64_t n, float* tmp) {
  const int64_t Dp = a.n.Dp;
  const float* acc = a.dQacc + (bh * a.n.Sp + i0) * Dp;
  for (int64_t i = 0; i < n; i++) store_row(acc + i * Dp, 1, a.dq_mul, a.rope, a.dq, bh, i0 + i, a.n.d.D, tmp);
}

template <class G>
MOE_ALWAYS_INLINE void native_backward_fused_body(const NativeBwd& a, Scratch<float>& scratch) {
  const AttentionDims& d = a.n.d;
  _Pragma("omp for schedule(dynamic, 1)") for (int64_t bg = 0; bg < d.B * d.Nkv; bg++) {
    const int64_t b = bg / d.Nkv, g = bg % d.Nkv;
    NativeTiles w(scratch.mine(), a.n.Dp);
    G::begin();
    for (int64_t kt = 0; kt < a.n.nt; kt++) native_key_tile<G>(a, b, g, kt, w, true);
    G::end();
    for (int64_t h = g * d.group(); h < (g + 1) * d.group(); h++) native_dq_rows(a, b * d.Nq + h, 0, d.S, w.row);
  }
}
template <class G>
void native_backward_fused(const NativeBwd& a, Scratch<float>& scratch) {
#pragma omp parallel
  MOE_CPU_CLONES(native_backward_fused_body<G>(a, scratch));
}

template <class G>
MOE_ALWAYS_INLINE void native_backward_two_pass_body(const NativeBwd& a, Scratch<float>& scratch) {
  const AttentionDims& d = a.n.d;
  const int64_t nt = a.n.nt, kv_pairs = d.B * d.Nkv, q_pairs = d.B * d.Nq;
  _Pragma("omp for schedule(dynamic, 1)") for (int64_t it = 0; it < kv_pairs * nt; it++) {
    NativeTiles w(scratch.mine(), a.n.Dp);
    const int64_t bg = it % kv_pairs;
    G::begin();
    native_key_tile<G>(a, bg / d.Nkv, bg % d.Nkv, it / kv_pairs, w, false);
    G::end();
  }
  _Pragma("omp for schedule(dynamic, 1)") for (int64_t it = 0; it < q_pairs * nt; it++) {
    NativeTiles w(scratch.mine(), a.n.Dp);
    const int64_t qt = nt - 1 - it / q_pairs, bh = it % q_pairs, i0 = qt * kTn;
    const int64_t b = bh / d.Nq, h = bh % d.Nq, n = std::min(kTn, d.S - i0);
    G::begin();
    for (int64_t kt = 0; kt <= qt; kt++) native_pair<G>(a, b, h, qt, kt, w, false, true);
    G::end();
    native_dq_rows(a, bh, i0, n, w.row);
  }
}
template <class G>
void native_backward_two_pass(const NativeBwd& a, Scratch<float>& scratch) {
#pragma omp parallel
  MOE_CPU_CLONES(native_backward_two_pass_body<G>(a, scratch));
}

// The sizes of a call whose tensors are f32 or bf16 each (NativeRows checks which), lse f32.
AttentionDims native_dims(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o, const Tensor& lse) {
  const AttentionDims d = attention_shapes(q, k, v);
  MOE_ASSERT_MSG(o.shape() == q.shape(), "attention output {} vs q {}", o.shape().str(), q.shape().str());
  MOE_ASSERT_SHAPE(lse, {d.B, d.Nq, d.S});
  MOE_ASSERT_MSG(lse.dtype() == DType::F32, "bf16 attention keeps lse in f32, got {}", dtype_name(lse.dtype()));
  return d;
}

// The kernel's RoPE from the caller's tables (f32, at least S rows of rot_dim/2).
std::optional<NativeRope> native_rope(const AttentionRope* rope, const AttentionDims& d) {
  if (!rope) return std::nullopt;
  const int64_t h = rope->rot_dim / 2;
  MOE_ASSERT_MSG(rope->rot_dim >= 2 && rope->rot_dim % 2 == 0 && rope->rot_dim <= d.D, "rotary dim {} vs head dim {}",
                 rope->rot_dim, d.D);
  for (const Tensor* t : {rope->cos_SR, rope->sin_SR})
    MOE_ASSERT_MSG(t->dtype() == DType::F32 && t->ndim() == 2 && t->dim(0) >= d.S && t->dim(1) == h,
                   "RoPE tables {} {} for {} rows of {} pairs", t->shape().str(), dtype_name(t->dtype()), d.S, h);
  return NativeRope{rope->cos_SR->data<float>(), rope->sin_SR->data<float>(), h};
}

template <class G>
void forward_with(const Tensor& q, const Tensor& k, const Tensor& v, double scale, Tensor& o, Tensor& lse,
                  const AttentionDropout* dropout, const AttentionRope* rope_in) {
  const NativeDims n(native_dims(q, k, v, o, lse));
  const AttentionDims& d = n.d;
  const std::optional<NativeRope> rope = native_rope(rope_in, d);
  const NativeRope* r = rope ? &*rope : nullptr;
  const FwdPacks pk(n, n, NativeRows(q, d, d.Nq), NativeRows(k, d, d.Nkv), NativeRows(v, d, d.Nkv),
                    static_cast<float>(scale), r);
  NativeFwd a{n, &pk, NativeRows(o, d, d.Nq), lse.data<float>(), dropout};
  Scratch<float> scratch(NativeFwdTiles::floats(n.Dp), DType::F32);
  native_forward_items<G>(a, scratch);
}

template <class G>
void backward_with(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                   const Tensor& lse, double scale, Tensor& dq, Tensor& dk, Tensor& dv, const AttentionDropout* dropout,
                   const AttentionRope* rope_in) {
  const NativeDims n(native_dims(q, k, v, o, lse));
  const AttentionDims& d = n.d;
  MOE_ASSERT(dout.shape() == q.shape() && dq.shape() == q.shape() && dk.shape() == k.shape() &&
             dv.shape() == v.shape());
  const std::optional<NativeRope> rope = native_rope(rope_in, d);
  const NativeRope* r = rope ? &*rope : nullptr;
  const int64_t q_pairs = d.B * d.Nq;
  const NativeRows doh(dout, d, d.Nq);
  Tensor delta = Tensor::empty({q_pairs, d.S}, DType::F32);
  native_delta(d, doh, NativeRows(o, d, d.Nq), delta.data<float>());
  const float sc = static_cast<float>(scale);
  const BwdPacks pk(n, n, NativeRows(q, d, d.Nq), doh, NativeRows(k, d, d.Nkv), NativeRows(v, d, d.Nkv), sc, r);
  Tensor dQacc = Tensor::empty({q_pairs * n.Sp * n.Dp}, DType::F32);
  NativeBwd a{n,
              &pk,
              lse.data<float>(),
              delta.data<float>(),
              dQacc.data<float>(),
              NativeRows(dq, d, d.Nq),
              NativeRows(dk, d, d.Nkv),
              NativeRows(dv, d, d.Nkv),
              sc,
              dropout,
              r};
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

void forward_native(const Tensor& q, const Tensor& k, const Tensor& v, double scale, Tensor& o, Tensor& lse,
                    const AttentionDropout* dropout, NativeBf16 backend, const AttentionRope* rope) {
  if (dropout && !dropout->on()) dropout = nullptr;
  with_backend(backend, [&](auto g) { forward_with<decltype(g)>(q, k, v, scale, o, lse, dropout, rope); });
}

void backward_native(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                     const Tensor& lse, double scale, Tensor& dq, Tensor& dk, Tensor& dv,
                     const AttentionDropout* dropout, NativeBf16 backend, const AttentionRope* rope) {
  if (dropout && !dropout->on()) dropout = nullptr;
  with_backend(backend,
               [&](auto g) { backward_with<decltype(g)>(dout, q, k, v, o, lse, scale, dq, dk, dv, dropout, rope); });
}

}  // namespace moecore::kernels::flash
