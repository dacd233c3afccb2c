// Causal self-attention with grouped-query heads, computed tile by tile with an online softmax (FlashAttention-2
// style): no S×S matrix is ever materialized, forward or backward. Query head h reads key/value head
// h / (Nq/Nkv). Backward recomputes probabilities from the saved log-sum-exp and runs in two deterministic passes
// (dK,dV by key tile; dQ by query tile), so no two threads ever add into the same element.
#pragma once

#include "moecore/core/tensor.h"

namespace moecore::kernels {

// q_SBND [S, B, Nq, D], k_SBND / v_SBND [S, B, Nkv, D] -> o_SBND [S, B, Nq, D], lse_BNS [B, Nq, S] (kept for
// backward; in units of the scaled scores). scale is usually 1/sqrt(D).
void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, double scale, Tensor& o, Tensor& lse);
// do_SBND -> dq, dk, dv (written).
void attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                        const Tensor& lse, double scale, Tensor& dq, Tensor& dk, Tensor& dv);

// The same attention with bf16 GEMM operands, for --bf16 training (attention_bf16.cpp): q, k, v, dout are f32 and
// rounded to bf16 where they enter a GEMM, probabilities and dS are rounded to bf16 for theirs; scores, softmax,
// lse and every output stay f32 — the precision of a bf16 FlashAttention on a GPU. Query blocks of a chunk of heads
// go through oneDNN batched matmuls against their visible keys with an exact (not online) softmax per row: a block
// holds [rows, visible keys] scores per head, bounded to ~8 MiB of f32 per chunk, never an S×S matrix once
// S > 128. Sequences longer than kMaxBf16AttentionSeq use the tiled kernel above instead.
void attention_forward_bf16(const Tensor& q, const Tensor& k, const Tensor& v, double scale, Tensor& o, Tensor& lse);
void attention_backward_bf16(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                             const Tensor& lse, double scale, Tensor& dq, Tensor& dk, Tensor& dv);
constexpr int64_t kMaxBf16AttentionSeq = 8192;

// Tile edge used for queries and keys (rows of a tile).
constexpr int64_t kAttnTile = 64;

// Sizes of one attention call, checked: q [S, B, Nq, D], k and v [S, B, Nkv, D] of one dtype, Nkv dividing Nq.
struct AttentionDims {
  int64_t S, B, Nq, Nkv, D;
  int64_t group() const { return Nq / Nkv; }      // query heads per kv head
  int64_t q_row() const { return B * Nq * D; }    // stride between sequence positions in q/o
  int64_t kv_row() const { return B * Nkv * D; }  // ... in k/v
  int64_t ntiles() const { return (S + kAttnTile - 1) / kAttnTile; }
};
AttentionDims attention_dims(const Tensor& q, const Tensor& k, const Tensor& v);
// The same, also checking a forward's outputs (o like q, lse [B, Nq, S] of q's dtype) or a backward's operands.
AttentionDims attention_forward_dims(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                                     const Tensor& lse);
AttentionDims attention_backward_dims(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                                      const Tensor& o, const Tensor& lse, const Tensor& dq, const Tensor& dk,
                                      const Tensor& dv);

}  // namespace moecore::kernels
