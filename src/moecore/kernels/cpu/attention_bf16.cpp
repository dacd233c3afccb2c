// Causal GQA attention with bf16 oneDNN GEMMs (attention_forward_bf16_onednn, see attention.h). Work is split into
// chunks of heads and, within a chunk, into query blocks of Bq rows; block [i0, i0+Bq) sees keys [0, i0+Bq), so the
// fully masked key range is skipped and no S×S matrix exists (a block's scores are [Bq, i0+Bq] per head, Bq ≤ S/2 once
// S > 128). Per block:
//   Q̂ = bf16(scale·Q), K̂ = bf16(K), V̂ = bf16(V), packed [c, rows, D] (a kv head repeats for its query heads)
//   forward:  Σ = Q̂·K̂ᵀ (f32);  P = softmax(Σ) over each row's visible keys, lse kept;  O = bf16(P)·V̂
//   backward: P = exp(Σ − lse);  dP = dÔ·V̂ᵀ;  dS = bf16(P ⊙ (dP − Δ));  dV += bf16(P)ᵀ·dÔ;  dK += dSᵀ·Q̂;
//             dQ = scale·dS·K̂  (Q̂ already carries the scale, so dK = scale·dSᵀ·Q)
// Attention dropout multiplies each row's probabilities by its multipliers Z before O = bf16(P ⊙ Z)·V̂; backward
// regenerates Z: dV uses bf16(P ⊙ Z) and dS = bf16(P ⊙ (Z ⊙ dP − Δ)).
// Every product is one oneDNN batched matmul over the chunk's heads (AMX where the CPU has it). dK and dV are summed
// over query heads and blocks in a fixed order, so results are bitwise reproducible.
#include <algorithm>
#include <cmath>

#include "moecore/core/cpu.h"
#include "moecore/kernels/attention.h"
#include "moecore/kernels/cpu/attention_flash.h"
#include "moecore/kernels/cpu/attention_flash_native.h"
#include "moecore/kernels/cpu/kernels.h"
#include "moecore/kernels/cpu/vec_math.h"
#include "moecore/kernels/gemm.h"

namespace moecore::kernels {

namespace {

// bf16 GEMM operands are rounded from f32 tensors here.
void require_f32(const Tensor& q) {
  MOE_ASSERT_MSG(q.dtype() == DType::F32, "bf16 attention takes f32 tensors (rounded to bf16 inside), got {}",
                 dtype_name(q.dtype()));
}

// Query blocks: at most 8 per sequence and at least 128 rows, so the set of GEMM shapes (one primitive each) stays
// small whatever S is.
struct Blocks {
  int64_t rows, count;
};
Blocks query_blocks(int64_t S) {
  const int64_t count = std::clamp<int64_t>((S + 127) / 128, 1, 8);
  const int64_t rows = (S + count - 1) / count;
  return {rows, (S + rows - 1) / rows};
}

// Heads per chunk: a chunk's f32 scores of the largest block stay within kScoreBudget bytes (at least one head).
constexpr int64_t kScoreBudget = int64_t(8) << 20;
int64_t chunk_heads(const AttentionDims& l, const Blocks& q) {
  return std::clamp<int64_t>(kScoreBudget / (q.rows * l.S * 4), 1, l.B * l.Nq);
}

// dst [c, n, D] bf16 ← rows s0..s0+n of src [S, B, N, D] for the head pairs r0..r0+c (pair r = b·Nq + h; pair r
// reads source head h / per_src, so a kv head repeats for its query group), times `scale`.
MOE_ALWAYS_INLINE void pack_body(const AttentionDims& l, const float* src, int64_t N, int64_t per_src, int64_t r0,
                                 int64_t c, int64_t s0, int64_t n, float scale, bf16* dst) {
  const int64_t D = l.D;
#pragma omp for schedule(static) collapse(2)
  for (int64_t j = 0; j < c; j++)
    for (int64_t s = 0; s < n; s++) {
      const int64_t r = r0 + j, b = r / l.Nq, h = (r % l.Nq) / per_src;
      const float* from = src + (((s0 + s) * l.B + b) * N + h) * D;
      bf16* to = dst + (j * n + s) * D;
      for (int64_t d = 0; d < D; d++) to[d] = float_to_bf16(from[d] * scale);
    }
}
void pack(const AttentionDims& l, const float* src, int64_t N, int64_t per_src, int64_t r0, int64_t c, int64_t s0,
          int64_t n, float scale, bf16* dst) {
#pragma omp parallel
  MOE_CPU_CLONES(pack_body(l, src, N, per_src, r0, c, s0, n, scale, dst));
}

// Rows s0..s0+n of dst [S, B, Nq, D] ← rows [c, n, D] for pairs r0..r0+c (one writer per element).
MOE_ALWAYS_INLINE void unpack_q_body(const AttentionDims& l, const float* rows, int64_t r0, int64_t c, int64_t s0,
                                     int64_t n, float* dst) {
  const int64_t D = l.D;
#pragma omp for schedule(static) collapse(2)
  for (int64_t j = 0; j < c; j++)
    for (int64_t s = 0; s < n; s++) {
      const int64_t r = r0 + j, b = r / l.Nq, h = r % l.Nq;
      std::copy_n(rows + (j * n + s) * D, D, dst + (((s0 + s) * l.B + b) * l.Nq + h) * D);
    }
}
void unpack_q(const AttentionDims& l, const float* rows, int64_t r0, int64_t c, int64_t s0, int64_t n, float* dst) {
#pragma omp parallel
  MOE_CPU_CLONES(unpack_q_body(l, rows, r0, c, s0, n, dst));
}

// Rows 0..n of dst [S, B, Nkv, D] += rows [c, n, D], summed over the query heads of each kv head in head order.
// Each thread owns whole sequence positions, so the order is fixed and no two threads touch one element.
MOE_ALWAYS_INLINE void accumulate_kv_body(const AttentionDims& l, const float* rows, int64_t r0, int64_t c, int64_t n,
                                          float* dst) {
  const int64_t D = l.D;
#pragma omp for schedule(static)
  for (int64_t s = 0; s < n; s++)
    for (int64_t j = 0; j < c; j++) {
      const int64_t r = r0 + j, b = r / l.Nq, g = (r % l.Nq) / l.group();
      const float* from = rows + (j * n + s) * D;
      float* to = dst + ((s * l.B + b) * l.Nkv + g) * D;
#pragma omp simd
      for (int64_t d = 0; d < D; d++) to[d] += from[d];
    }
}
void accumulate_kv(const AttentionDims& l, const float* rows, int64_t r0, int64_t c, int64_t n, float* dst) {
#pragma omp parallel
  MOE_CPU_CLONES(accumulate_kv_body(l, rows, r0, c, n, dst));
}

// One query block's scores [c, nq, nk]: row i (sequence position i0 + i) sees keys 0..i0+i.
struct BlockRows {
  int64_t c, nq, nk, i0;
  int64_t visible(int64_t row) const { return i0 + row % nq + 1; }
};

// Dropout multipliers of block row `row` (pairs from r0), keys k0 .. k0+n, into z.
inline void row_dropout(const AttentionDims& l, const AttentionDropout& d, const BlockRows& br, int64_t r0, int64_t row,
                        int64_t k0, int64_t n, float* z) {
  const int64_t r = r0 + row / br.nq;
  d.row(r / l.Nq, r % l.Nq, br.i0 + row % br.nq, k0, n, z);
}
constexpr int64_t kZChunk = 64;  // keys per batch of multipliers

// Causal softmax of each row: probabilities as bf16 (zero past the visible keys) and the row's lse into
// lse[j·S + i0 + i]. The scores are overwritten with the unnormalized exponentials.
MOE_ALWAYS_INLINE void softmax_rows_body(const AttentionDims& l, const BlockRows& br, int64_t r0, float* scores,
                                         bf16* probs, float* lse, const AttentionDropout* drop) {
  const int64_t S = l.S;
#pragma omp for schedule(static)
  for (int64_t row = 0; row < br.c * br.nq; row++) {
    const int64_t n = br.visible(row);
    float* s = scores + row * br.nk;
    bf16* p = probs + row * br.nk;
    float mx = s[0];
#pragma omp simd reduction(max : mx)
    for (int64_t k = 1; k < n; k++) mx = s[k] > mx ? s[k] : mx;
    float sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int64_t k = 0; k < n; k++) {
      s[k] = vexp(s[k] - mx);
      sum += s[k];
    }
    const float inv = 1.0f / sum;
    if (drop) {
      float z[kZChunk];
      for (int64_t k0 = 0; k0 < n; k0 += kZChunk) {
        const int64_t m = std::min(kZChunk, n - k0);
        row_dropout(l, *drop, br, r0, row, k0, m, z);
        for (int64_t k = 0; k < m; k++) p[k0 + k] = float_to_bf16(s[k0 + k] * inv * z[k]);
      }
    } else {
#pragma omp simd
      for (int64_t k = 0; k < n; k++) p[k] = float_to_bf16(s[k] * inv);
    }
    for (int64_t k = n; k < br.nk; k++) p[k] = bf16{0};
    lse[row / br.nq * S + br.i0 + row % br.nq] = mx + std::log(sum);
  }
}
void softmax_rows(const AttentionDims& l, const BlockRows& br, int64_t r0, float* scores, bf16* probs, float* lse,
                  const AttentionDropout* drop) {
#pragma omp parallel
  MOE_CPU_CLONES(softmax_rows_body(l, br, r0, scores, probs, lse, drop));
}

// P = exp(Σ − lse) as bf16 into `probs` and dS = P ⊙ (dP − Δ) as bf16 into `dS` (zero past the visible keys);
// Δ is per row of the block.
MOE_ALWAYS_INLINE void softmax_backward_rows_body(const AttentionDims& ld, const BlockRows& br, int64_t r0,
                                                  const float* scores, const float* lse, const float* dP,
                                                  const float* delta, bf16* probs, bf16* dS,
                                                  const AttentionDropout* drop) {
  const int64_t S = ld.S;
#pragma omp for schedule(static)
  for (int64_t row = 0; row < br.c * br.nq; row++) {
    const int64_t n = br.visible(row);
    const float* s = scores + row * br.nk;
    const float* dp = dP + row * br.nk;
    bf16* p = probs + row * br.nk;
    bf16* ds = dS + row * br.nk;
    const float l = lse[row / br.nq * S + br.i0 + row % br.nq], dl = delta[row];
    if (drop) {
      float z[kZChunk];
      for (int64_t k0 = 0; k0 < n; k0 += kZChunk) {
        const int64_t m = std::min(kZChunk, n - k0);
        row_dropout(ld, *drop, br, r0, row, k0, m, z);
        for (int64_t k = 0; k < m; k++) {
          const float pk = vexp(s[k0 + k] - l);
          p[k0 + k] = float_to_bf16(pk * z[k]);
          ds[k0 + k] = float_to_bf16(pk * (dp[k0 + k] * z[k] - dl));
        }
      }
    } else {
#pragma omp simd
      for (int64_t k = 0; k < n; k++) {
        const float pk = vexp(s[k] - l);
        p[k] = float_to_bf16(pk);
        ds[k] = float_to_bf16(pk * (dp[k] - dl));
      }
    }
    for (int64_t k = n; k < br.nk; k++) p[k] = ds[k] = bf16{0};
  }
}
void softmax_backward_rows(const AttentionDims& ld, const BlockRows& br, int64_t r0, const float* scores,
                           const float* lse, const float* dP, const float* delta, bf16* probs, bf16* dS,
                           const AttentionDropout* drop) {
#pragma omp parallel
  MOE_CPU_CLONES(softmax_backward_rows_body(ld, br, r0, scores, lse, dP, delta, probs, dS, drop));
}

// A block's packed operands: queries [c, nq, D] (scaled), keys and values [c, nk, D].
struct Packed {
  Tensor q, k, v;
};

Packed pack_block(const AttentionDims& l, const Tensor& q, const Tensor& k, const Tensor& v, int64_t r0,
                  const BlockRows& br, float scale) {
  Packed p{Tensor::empty({br.c, br.nq, l.D}, DType::BF16), Tensor::empty({br.c, br.nk, l.D}, DType::BF16),
           Tensor::empty({br.c, br.nk, l.D}, DType::BF16)};
  pack(l, q.data<float>(), l.Nq, 1, r0, br.c, br.i0, br.nq, scale, p.q.data<bf16>());
  pack(l, k.data<float>(), l.Nkv, l.group(), r0, br.c, 0, br.nk, 1.0f, p.k.data<bf16>());
  pack(l, v.data<float>(), l.Nkv, l.group(), r0, br.c, 0, br.nk, 1.0f, p.v.data<bf16>());
  return p;
}

// Runs fn(r0, block rows) over chunks of head pairs and their query blocks, in a fixed order.
template <typename Fn>
void for_each_block(const AttentionDims& l, Fn fn) {
  const Blocks qb = query_blocks(l.S);
  const int64_t pairs = l.B * l.Nq, chunk = chunk_heads(l, qb);
  for (int64_t r0 = 0; r0 < pairs; r0 += chunk)
    for (int64_t i0 = 0; i0 < l.S; i0 += qb.rows) {
      const int64_t nq = std::min(qb.rows, l.S - i0);
      fn(r0, BlockRows{std::min(chunk, pairs - r0), nq, i0 + nq, i0});
    }
}

}  // namespace

void attention_forward_bf16_onednn(const Tensor& q, const Tensor& k, const Tensor& v, double scale, Tensor& o,
                                   Tensor& lse, const AttentionDropout* dropout) {
  cpu::require_cpu(q, "attention_forward_bf16_onednn");
  require_f32(q);
  const AttentionDims l = attention_forward_dims(q, k, v, o, lse);
  if (dropout && !dropout->on()) dropout = nullptr;
  for_each_block(l, [&](int64_t r0, const BlockRows& br) {
    const Packed p = pack_block(l, q, k, v, r0, br, static_cast<float>(scale));
    Tensor scores = Tensor::empty({br.c, br.nq, br.nk}, DType::F32);
    Tensor probs = Tensor::empty({br.c, br.nq, br.nk}, DType::BF16);
    gemm_batched(p.q, false, p.k, true, scores);
    softmax_rows(l, br, r0, scores.data<float>(), probs.data<bf16>(), lse.data<float>() + r0 * l.S, dropout);
    Tensor out = Tensor::empty({br.c, br.nq, l.D}, DType::F32);
    gemm_batched(probs, false, p.v, false, out);
    unpack_q(l, out.data<float>(), r0, br.c, br.i0, br.nq, o.data<float>());
  });
}

void attention_backward_bf16_onednn(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                                    const Tensor& o, const Tensor& lse, double scale, Tensor& dq, Tensor& dk,
                                    Tensor& dv, const AttentionDropout* dropout) {
  cpu::require_cpu(q, "attention_backward_bf16_onednn");
  require_f32(q);
  const AttentionDims l = attention_backward_dims(dout, q, k, v, o, lse, dq, dk, dv);
  if (dropout && !dropout->on()) dropout = nullptr;
  const int64_t S = l.S, D = l.D;
  dk.zero_();
  dv.zero_();
  for_each_block(l, [&](int64_t r0, const BlockRows& br) {
    const Packed p = pack_block(l, q, k, v, r0, br, static_cast<float>(scale));
    Tensor dO = Tensor::empty({br.c, br.nq, D}, DType::BF16), delta = Tensor::empty({br.c, br.nq}, DType::F32);
    pack(l, dout.data<float>(), l.Nq, 1, r0, br.c, br.i0, br.nq, 1.0f, dO.data<bf16>());
    {  // Δ_i = Σ_d dO_id·O_id, from the f32 tensors
      const float *od = o.data<float>(), *dod = dout.data<float>();
      float* dl = delta.data<float>();
#pragma omp parallel for schedule(static) collapse(2)
      for (int64_t j = 0; j < br.c; j++)
        for (int64_t i = 0; i < br.nq; i++) {
          const int64_t r = r0 + j, off = (((br.i0 + i) * l.B + r / l.Nq) * l.Nq + r % l.Nq) * D;
          float acc = 0;
          for (int64_t d = 0; d < D; d++) acc += dod[off + d] * od[off + d];
          dl[j * br.nq + i] = acc;
        }
    }
    const Shape sq{br.c, br.nq, br.nk};
    Tensor scores = Tensor::empty(sq, DType::F32), dP = Tensor::empty(sq, DType::F32);
    Tensor probs = Tensor::empty(sq, DType::BF16), dS = Tensor::empty(sq, DType::BF16);
    gemm_batched(p.q, false, p.k, true, scores);
    gemm_batched(dO, false, p.v, true, dP);
    softmax_backward_rows(l, br, r0, scores.data<float>(), lse.data<float>() + r0 * S, dP.data<float>(),
                          delta.data<float>(), probs.data<bf16>(), dS.data<bf16>(), dropout);
    Tensor kv_rows = Tensor::empty({br.c, br.nk, D}, DType::F32);
    gemm_batched(probs, true, dO, false, kv_rows);  // dV per query head
    accumulate_kv(l, kv_rows.data<float>(), r0, br.c, br.nk, dv.data<float>());
    gemm_batched(dS, true, p.q, false, kv_rows);  // dK per query head
    accumulate_kv(l, kv_rows.data<float>(), r0, br.c, br.nk, dk.data<float>());
    Tensor q_rows = Tensor::empty({br.c, br.nq, D}, DType::F32);
    gemm_batched(dS, false, p.k, false, q_rows, static_cast<float>(scale));  // dQ
    unpack_q(l, q_rows.data<float>(), r0, br.c, br.i0, br.nq, dq.data<float>());
  });
}

int64_t attention_backward_bf16_onednn_bytes(int64_t S, int64_t B, int64_t heads, int64_t D) {
  AttentionDims l{};
  l.S = S, l.B = B, l.Nq = heads, l.D = D;
  const Blocks qb = query_blocks(S);
  const int64_t c = std::min(chunk_heads(l, qb), B * heads), nq = qb.rows, nk = S;  // the last block sees every key
  return c * nq * nk * (4 + 4 + 2 + 2) + c * nq * D * (2 + 2 + 4) + c * nk * D * (2 + 2 + 4) + c * nq * 4;
}

int64_t attention_backward_bf16_bytes(int64_t S, int64_t B, int64_t heads, int64_t kv_heads, int64_t D) {
  switch (bf16_attention_kernel()) {
    case Bf16AttentionKernel::FlashNative:
      return flash::backward_native_bytes(S, B, heads, kv_heads, D);
    case Bf16AttentionKernel::OneDnn:
      return attention_backward_bf16_onednn_bytes(S, B, heads, D);
    case Bf16AttentionKernel::Flash:
      return flash::backward_bytes(S, B, heads, kv_heads, D, /*round_bf16=*/true);
  }
  return 0;
}

// FlashNative wherever its instructions exist: it beats OneDnn at both of bench attention's shapes
// (docs/performance.md), and AMX runs the same schedule with 16 × 16 tiles.
Bf16AttentionKernel bf16_attention_kernel() {
  if (flash::has_native_bf16()) return Bf16AttentionKernel::FlashNative;
  return gemm_stats().bf16_native ? Bf16AttentionKernel::OneDnn : Bf16AttentionKernel::Flash;
}

bool attention_bf16_native_io() {
  return bf16_attention_kernel() == Bf16AttentionKernel::FlashNative;
}

namespace {
// The other kernels take f32 tensors and no RoPE (attention.h).
void require_plain(const AttentionRope* rope, std::initializer_list<const Tensor*> ts) {
  MOE_ASSERT_MSG(!rope, "only the FlashNative bf16 attention kernel applies RoPE itself");
  for (const Tensor* t : ts)
    MOE_ASSERT_MSG(t->dtype() == DType::F32, "this CPU's bf16 attention kernel takes f32 tensors, got {}",
                   dtype_name(t->dtype()));
}
}  // namespace

namespace cpu {
// value_dim: the channels past it are zero in v (and dout); the kernels compute them (as zeros) like any other.
void attention_forward_bf16(const Tensor& q, const Tensor& k, const Tensor& v, double scale, Tensor& o, Tensor& lse,
                            const AttentionDropout* dropout, const AttentionRope* rope, int64_t /*value_dim*/) {
  const Bf16AttentionKernel kernel = bf16_attention_kernel();
  if (kernel != Bf16AttentionKernel::FlashNative) require_plain(rope, {&q, &k, &v, &o});
  if (kernel == Bf16AttentionKernel::FlashNative)
    flash::forward_native(q, k, v, scale, o, lse, dropout, flash::best_native_bf16(), rope);
  else if (kernel == Bf16AttentionKernel::OneDnn)
    attention_forward_bf16_onednn(q, k, v, scale, o, lse, dropout);
  else
    flash::forward(q, k, v, scale, o, lse, dropout, /*round_bf16=*/true);
}

void attention_backward_bf16(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                             const Tensor& lse, double scale, Tensor& dq, Tensor& dk, Tensor& dv,
                             const AttentionDropout* dropout, const AttentionRope* rope, int64_t /*value_dim*/) {
  const Bf16AttentionKernel kernel = bf16_attention_kernel();
  if (kernel != Bf16AttentionKernel::FlashNative) require_plain(rope, {&dout, &q, &k, &v, &o, &dq, &dk, &dv});
  if (kernel == Bf16AttentionKernel::FlashNative)
    flash::backward_native(dout, q, k, v, o, lse, scale, dq, dk, dv, dropout, flash::best_native_bf16(), rope);
  else if (kernel == Bf16AttentionKernel::OneDnn)
    attention_backward_bf16_onednn(dout, q, k, v, o, lse, scale, dq, dk, dv, dropout);
  else
    flash::backward(dout, q, k, v, o, lse, scale, dq, dk, dv, dropout, /*round_bf16=*/true);
}
}  // namespace cpu

}  // namespace moecore::kernels
