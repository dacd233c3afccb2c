// Cross-entropy fused with log-softmax over the vocabulary: loss_t = logsumexp(logits_t) − logits_t[target_t].
// The loss mask and the averaging live in the upstream gradient dloss_T, so one kernel serves every reduction.
#pragma once

#include "moecore/core/tensor.h"

namespace moecore::kernels {

// logits_TV [T, V], targets_T [T] (i32/i64) -> loss_T [T], lse_T [T] (kept for backward).
void cross_entropy_forward(const Tensor& logits_TV, const Tensor& targets_T, Tensor& loss_T, Tensor& lse_T);
// dlogits_TV = (softmax(logits) − onehot(target)) · dloss_T (written; may alias logits_TV to save memory).
void cross_entropy_backward(const Tensor& dloss_T, const Tensor& logits_TV, const Tensor& targets_T,
                            const Tensor& lse_T, Tensor& dlogits_TV);

}  // namespace moecore::kernels
