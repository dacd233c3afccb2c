// Blocks of attention at global positions for context parallelism (attention.h attention_block_forward/backward
// with round_bf16, where bf16_attention_kernel() is FlashNative) on the native-bf16 block products: the schedule and
// masks of attention_flash_block.cpp — key j visible to row i when k0 + j ≤ q0 + i, key tiles past a query tile's
// last row skipped, every other tile product a full one masked per element (q0 − k0 need not fall on tile
// boundaries), a row that sees no key o 0 and lse −inf — with the operands of the whole-sequence native kernel
// (attention_flash_native.cpp): Q̂ = bf16(scale·Q), K̂, V̂, dÔ packed once per call (attention_native_parts.h), P̂
// and dŜ rounded where they enter a product, scores, softmax statistics and every output f32.
//   forward, per (b, head, query tile): online softmax over the visible key tiles, O += P̂·V̂.
//   backward, Δ of the final o, two passes with one writer per element: dKᵀ += Q̂ᵀ·dŜ and dVᵀ += dÔᵀ·P̂ per
//     (b, kv head, key tile) over the group's heads and query tiles ascending; dQ = dŜ·K̂ per (b, head, query tile)
//     over key tiles ascending, times scale, added to dq.
#include <algorithm>
#include <cmath>
#include <limits>

#include "moecore/kernels/cpu/attention_flash_native.h"
#include "moecore/kernels/cpu/attention_native_parts.h"
#include "moecore/kernels/cpu/attention_native_softmax.h"

namespace moecore::kernels::flash {

namespace {

// Where the block's rows and keys sit: query i at q0 + i, key j at k0 + j.
struct BlockPlace {
  int64_t Sq, Sk, q0, k0;
  // Keys of local row i visible within the key tile starting at j0 (0 .. nc).
  int64_t visible(int64_t i, int64_t j0, int64_t nc) const {
    return std::clamp(q0 + i - (k0 + j0) + 1, int64_t{0}, nc);
  }
  // Key tile kt has a key visible to some row of query tile qt.
  bool any(int64_t qt, int64_t kt) const { return k0 + kt * kTn <= q0 + std::min(Sq, (qt + 1) * kTn) - 1; }
};

// The call's sizes for q-shaped tensors (S = Sq) and for k-shaped ones (S = Sk).
struct BlockDims {
  NativeDims nq, nk;
  BlockPlace at;
};

BlockDims block_dims(const Tensor& q, const Tensor& k, const Tensor& v, int64_t q0, int64_t k0) {
  MOE_ASSERT_MSG(q.ndim() == 4 && k.ndim() == 4, "attention block wants [S, B, N, D], got q {} k {}", q.shape().str(),
                 k.shape().str());
  AttentionDims dq{q.dim(0), q.dim(1), q.dim(2), k.dim(2), q.dim(3)};
  MOE_ASSERT_SHAPE(k, {k.dim(0), dq.B, dq.Nkv, dq.D});
  MOE_ASSERT(v.shape() == k.shape());
  MOE_ASSERT_MSG(dq.Nkv > 0 && dq.Nq % dq.Nkv == 0, "query heads {} not a multiple of kv heads {}", dq.Nq, dq.Nkv);
  AttentionDims dk = dq;
  dk.S = k.dim(0);
  return {NativeDims(dq), NativeDims(dk), BlockPlace{dq.S, dk.S, q0, k0}};
}

using BlockFwd = FwdCall<BlockDims>;

template <class G>
MOE_ALWAYS_INLINE void block_forward_items_body(const BlockFwd& a, Scratch<float>& scratch) {
  const AttentionDims& d = a.n.nq.d;
  const BlockPlace& at = a.n.at;
  const int64_t D = d.D, Dp = a.n.nq.Dp, nqt = a.n.nq.nt, nkt = a.n.nk.nt, pairs = d.B * d.Nq;
  _Pragma("omp for schedule(dynamic, 1)") for (int64_t it = 0; it < pairs * nqt; it++) {
    const int64_t qt = nqt - 1 - it / pairs, bh = it % pairs;
    const int64_t b = bh / d.Nq, h = bh % d.Nq, bg = b * d.Nkv + h / d.group();
    const NativeFwdTiles w(scratch.mine(), Dp);
    float *acc = w.acc, *sc = w.sc, *m = w.m, *l = w.l, *row = w.row;
    const DropoutMask head = a.drop ? a.drop->head_mask(h) : DropoutMask{};
    bf16* P = w.P;
    const int64_t i0 = qt * kTn, nr = std::min(kTn, at.Sq - i0), M = round_up(nr, 16);
    std::fill_n(m, M, -std::numeric_limits<float>::infinity());
    std::fill_n(l, M, 0.0f);
    std::fill(P + nr * kTn, P + M * kTn, bf16{0});  // padding rows: native_softmax_rows writes the others whole
    bool stored = false;
    G::begin();
    for (int64_t kt = 0; kt < nkt && at.any(qt, kt); kt++) {
      const int64_t j0 = kt * kTn, nc = std::min(kTn, at.Sk - j0);
      G::run({M, kTn, Dp, ptile(a.pk->qR, a.n.nq, bh, qt), Dp, ptile(a.pk->kT, a.n.nk, bg, kt), 2 * kTn, sc, kTn, false,
              Causal::Full});
      for_tile_rows(a.drop, head, b, i0, nr, j0, nc, [&](int64_t i, const RowDrop* drop) {
        const int64_t jmax = at.visible(i0 + i, j0, nc);
        float alpha = 1.0f;
        if (jmax > 0)
          native_softmax_rows<1>(sc + i * kTn, &jmax, m + i, l + i, &drop, P + i * kTn, &alpha);
        else
          std::fill(P + i * kTn, P + (i + 1) * kTn, bf16{0});
        if (stored && alpha != 1.0f) {
          float* ar = acc + i * Dp;
#pragma omp simd
          for (int64_t e = 0; e < Dp; e++) ar[e] *= alpha;
        }
      });
      G::run({M, Dp, kTn, P, kTn, ptile(a.pk->vN, a.n.nk, bg, kt), 2 * Dp, acc, Dp, stored, Causal::Full});
      stored = true;
    }
    G::end();
    if (!stored) std::fill_n(acc, nr * Dp, 0.0f);  // no key tile reaches these rows
    for (int64_t i = 0; i < nr; i++) {
      const bool none = l[i] == 0.0f;
      store_row(acc + i * Dp, 1, none ? 0.0f : 1.0f / l[i], nullptr, a.o, bh, i0 + i, D, row);
      a.lse[bh * at.Sq + i0 + i] = none ? -std::numeric_limits<float>::infinity() : m[i] + std::log(l[i]);
    }
  }
}
template <class G>
void block_forward_items(const BlockFwd& a, Scratch<float>& scratch) {
#pragma omp parallel
  MOE_CPU_CLONES(block_forward_items_body<G>(a, scratch));
}

struct BlockBwd {
  BlockDims n;
  const BwdPacks* pk;
  const float *lse, *delta;
  NativeRows dk, dv;
  float* dq;  // f32, added to
  float scale;
  const AttentionDropout* drop;
};

// P̂ (w.P) and dŜ (w.dS) of head (b, h)'s query tile qt against key tile kt, zero where masked or padded.
template <class G>
MOE_ALWAYS_INLINE void block_probs(const BlockBwd& a, int64_t b, int64_t h, int64_t qt, int64_t kt, NativeTiles& w) {
  const AttentionDims& d = a.n.nq.d;
  const BlockPlace& at = a.n.at;
  const int64_t Dp = a.n.nq.Dp, bh = b * d.Nq + h, bg = b * d.Nkv + h / d.group();
  const int64_t i0 = qt * kTn, nr = std::min(kTn, at.Sq - i0), j0 = kt * kTn, nc = std::min(kTn, at.Sk - j0);
  const int64_t Mq = round_up(nr, 16);
  const bf16* kTt = ptile(a.pk->kT, a.n.nk, bg, kt);
  G::run({Mq, kTn, Dp, ptile(a.pk->qR, a.n.nq, bh, qt), Dp, kTt, 2 * kTn, w.sc, kTn, false, Causal::Full});
  G::run({Mq, kTn, Dp, ptile(a.pk->dR, a.n.nq, bh, qt), Dp, ptile(a.pk->vT, a.n.nk, bg, kt), 2 * kTn, w.dp, kTn, false,
          Causal::Full});
  const DropoutMask head = a.drop ? a.drop->head_mask(h) : DropoutMask{};
  for_tile_rows(a.drop, head, b, i0, nr, j0, nc, [&](int64_t i, const RowDrop* drop) {
    native_softmax_backward_row(w.sc + i * kTn, w.dp + i * kTn, a.lse[bh * at.Sq + i0 + i],
                                a.delta[bh * at.Sq + i0 + i], drop, at.visible(i0 + i, j0, nc), w.P + i * kTn,
                                w.dS + i * kTn);
  });
  std::fill(w.P + nr * kTn, w.P + kTn * kTn, bf16{0});
  std::fill(w.dS + nr * kTn, w.dS + kTn * kTn, bf16{0});
}

template <class G>
MOE_ALWAYS_INLINE void block_backward_items_body(const BlockBwd& a, Scratch<float>& scratch) {
  const AttentionDims& d = a.n.nq.d;
  const BlockPlace& at = a.n.at;
  const int64_t D = d.D, Dp = a.n.nq.Dp, nqt = a.n.nq.nt, nkt = a.n.nk.nt;
  const int64_t kv_pairs = d.B * d.Nkv, q_pairs = d.B * d.Nq;
  // dK, dV per (key tile, b, kv head).
  _Pragma("omp for schedule(dynamic, 1)") for (int64_t it = 0; it < kv_pairs * nkt; it++) {
    NativeTiles w(scratch.mine(), Dp);
    const int64_t kt = it / kv_pairs, bg = it % kv_pairs, b = bg / d.Nkv, g = bg % d.Nkv;
    const int64_t j0 = kt * kTn, nc = std::min(kTn, at.Sk - j0);
    bool stored = false;
    G::begin();
    for (int64_t h = g * d.group(); h < (g + 1) * d.group(); h++)
      for (int64_t qt = 0; qt < nqt; qt++) {
        if (!at.any(qt, kt)) continue;
        const int64_t bh = b * d.Nq + h;
        block_probs<G>(a, b, h, qt, kt, w);
        row_pairs(w.P, w.Pp);
        row_pairs(w.dS, w.dSp);
        G::run({Dp, kTn, kTn, ptile(a.pk->dT, a.n.nq, bh, qt), kTn, reinterpret_cast<const bf16*>(w.Pp), 2 * kTn, w.dVt,
                kTn, stored, Causal::Full});
        G::run({Dp, kTn, kTn, ptile(a.pk->qT, a.n.nq, bh, qt), kTn, reinterpret_cast<const bf16*>(w.dSp), 2 * kTn,
                w.dKt, kTn, stored, Causal::Full});
        stored = true;
      }
    G::end();
    if (!stored) {  // no query row sees these keys
      std::fill_n(w.dKt, Dp * kTn, 0.0f);
      std::fill_n(w.dVt, Dp * kTn, 0.0f);
    }
    store_transposed_tile(w.dKt, Dp, nullptr, a.dk, bg, j0, nc, D, w.tr, w.row);
    store_transposed_tile(w.dVt, Dp, nullptr, a.dv, bg, j0, nc, D, w.tr, w.row);
  }
  // dQ per (query tile, b, head), summed in w.dKt ([kTn, Dp] here) and added to dq.
  _Pragma("omp for schedule(dynamic, 1)") for (int64_t it = 0; it < q_pairs * nqt; it++) {
    NativeTiles w(scratch.mine(), Dp);
    const int64_t qt = nqt - 1 - it / q_pairs, bh = it % q_pairs, b = bh / d.Nq, h = bh % d.Nq;
    const int64_t bg = b * d.Nkv + h / d.group(), i0 = qt * kTn, nr = std::min(kTn, at.Sq - i0);
    const int64_t Mq = round_up(nr, 16);
    bool stored = false;
    G::begin();
    for (int64_t kt = 0; kt < nkt && at.any(qt, kt); kt++) {
      block_probs<G>(a, b, h, qt, kt, w);
      G::run({Mq, Dp, kTn, w.dS, kTn, ptile(a.pk->kN, a.n.nk, bg, kt), 2 * Dp, w.dKt, Dp, stored, Causal::Full});
      stored = true;
    }
    G::end();
    if (!stored) continue;
    for (int64_t i = 0; i < nr; i++) {
      float* r = a.dq + (i0 + i) * d.q_row() + bh * D;
      const float* acc = w.dKt + i * Dp;
#pragma omp simd
      for (int64_t e = 0; e < D; e++) r[e] += acc[e] * a.scale;
    }
  }
}
template <class G>
void block_backward_items(const BlockBwd& a, Scratch<float>& scratch) {
#pragma omp parallel
  MOE_CPU_CLONES(block_backward_items_body<G>(a, scratch));
}

void require_f32_block(std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts)
    MOE_ASSERT_MSG(t->dtype() == DType::F32, "bf16 attention blocks take f32 tensors (rounded inside), got {}",
                   dtype_name(t->dtype()));
}

template <class G>
void block_forward_with(const Tensor& q, const Tensor& k, const Tensor& v, int64_t q0, int64_t k0, double scale,
                        Tensor& o, Tensor& lse, const AttentionDropout* dropout) {
  const BlockDims n = block_dims(q, k, v, q0, k0);
  const AttentionDims& d = n.nq.d;
  MOE_ASSERT(o.shape() == q.shape());
  MOE_ASSERT_SHAPE(lse, {d.B, d.Nq, d.S});
  require_f32_block({&q, &k, &v, &o, &lse});
  const FwdPacks pk(n.nq, n.nk, NativeRows(q, d, d.Nq), NativeRows(k, d, d.Nkv), NativeRows(v, d, d.Nkv),
                    static_cast<float>(scale), nullptr);
  BlockFwd a{n, &pk, NativeRows(o, d, d.Nq), lse.data<float>(), dropout};
  Scratch<float> scratch(NativeFwdTiles::floats(n.nq.Dp), DType::F32);
  block_forward_items<G>(a, scratch);
}

template <class G>
void block_backward_with(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                         const Tensor& lse, int64_t q0, int64_t k0, double scale, Tensor& dq, Tensor& dk, Tensor& dv,
                         const AttentionDropout* dropout) {
  const BlockDims n = block_dims(q, k, v, q0, k0);
  const AttentionDims& d = n.nq.d;
  MOE_ASSERT(dout.shape() == q.shape() && o.shape() == q.shape() && dq.shape() == q.shape());
  MOE_ASSERT(dk.shape() == k.shape() && dv.shape() == v.shape());
  MOE_ASSERT_SHAPE(lse, {d.B, d.Nq, d.S});
  require_f32_block({&dout, &q, &k, &v, &o, &lse, &dq, &dk, &dv});
  const NativeRows doh(dout, d, d.Nq);
  Tensor delta = Tensor::empty({d.B * d.Nq, d.S}, DType::F32);
  native_delta(d, doh, NativeRows(o, d, d.Nq), delta.data<float>());
  const float sc = static_cast<float>(scale);
  const BwdPacks pk(n.nq, n.nk, NativeRows(q, d, d.Nq), doh, NativeRows(k, d, d.Nkv), NativeRows(v, d, d.Nkv), sc,
                    nullptr);
  BlockBwd a{n,
             &pk,
             lse.data<float>(),
             delta.data<float>(),
             NativeRows(dk, d, d.Nkv),
             NativeRows(dv, d, d.Nkv),
             dq.data<float>(),
             sc,
             dropout};
  Scratch<float> scratch(NativeTiles::floats(n.nq.Dp), DType::F32);
  block_backward_items<G>(a, scratch);
}

}  // namespace

void block_forward_native(const Tensor& q, const Tensor& k, const Tensor& v, int64_t q0, int64_t k0, double scale,
                          Tensor& o, Tensor& lse, const AttentionDropout* dropout, NativeBf16 backend) {
  if (dropout && !dropout->on()) dropout = nullptr;
  with_backend(backend, [&](auto g) { block_forward_with<decltype(g)>(q, k, v, q0, k0, scale, o, lse, dropout); });
}

void block_backward_native(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                           const Tensor& lse, int64_t q0, int64_t k0, double scale, Tensor& dq, Tensor& dk, Tensor& dv,
                           const AttentionDropout* dropout, NativeBf16 backend) {
  if (dropout && !dropout->on()) dropout = nullptr;
  with_backend(backend, [&](auto g) {
    block_backward_with<decltype(g)>(dout, q, k, v, o, lse, q0, k0, scale, dq, dk, dv, dropout);
  });
}

}  // namespace moecore::kernels::flash
