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

// Tile edge used for queries and keys (rows of a tile).
constexpr int64_t kAttnTile = 64;

}  // namespace moecore::kernels
