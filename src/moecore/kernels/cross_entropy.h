// Cross-entropy fused with log-softmax over the vocabulary: loss_t = logsumexp(logits_t) − logits_t[target_t].
// The loss mask and the averaging live in the upstream gradient dloss_T, so one kernel serves every reduction.
#pragma once

#include <functional>

#include "moecore/core/tensor.h"

namespace moecore::kernels {

// logits_TV [T, V], targets_T [T] (i32/i64) -> loss_T [T], lse_T [T] (kept for backward), of the dtype
// cross_entropy_stats_dtype names. On the CPU the logits may be bf16 (Megatron's bf16 output layer): computed in f32.
DType cross_entropy_stats_dtype(DType logits);
void cross_entropy_forward(const Tensor& logits_TV, const Tensor& targets_T, Tensor& loss_T, Tensor& lse_T);
// dlogits_TV = (softmax(logits) − onehot(target)) · dloss_T (written; may alias logits_TV to save memory). On the
// CPU, dlogits_TV may be bf16 for f32 or bf16 logits: the f32 gradient rounded as it is stored, for a bf16 output
// layer (and it may overwrite bf16 logits).
// Vocabulary-parallel: logits_TV holds columns [vocab_start, vocab_start + V) and lse_T is over all columns.
void cross_entropy_backward(const Tensor& dloss_T, const Tensor& logits_TV, const Tensor& targets_T,
                            const Tensor& lse_T, Tensor& dlogits_TV, int64_t vocab_start = 0);

// Forward and backward at once, for training when dloss_T is known before forward: loss_T and lse_T as
// cross_entropy_forward gives them, and logits_TV overwritten by its gradient as cross_entropy_backward(dloss_T, ...,
// logits_TV) writes it. On the CPU with f32 or bf16 logits one pass computes each exponential once (the gradient as
// e·(g/s) rather than exp(l − lse)·g: equal up to rounding); elsewhere it is the two calls.
void cross_entropy_forward_backward(Tensor& logits_TV, const Tensor& targets_T, const Tensor& dloss_T, Tensor& loss_T,
                                    Tensor& lse_T);

// Vocabulary-parallel forward (Megatron's vocab_parallel_cross_entropy): logits_TV holds columns
// [vocab_start, vocab_start + V) of a vocabulary of vocab_total; `all_reduce(t, max)` reduces t (f32/f64) over
// the ranks holding the other columns, with max or sum. Row max, then Σ exp and the target's logit, are reduced.
using ReduceFn = std::function<void(Tensor&, bool max)>;
void cross_entropy_forward_vocab_parallel(const Tensor& logits_TV, const Tensor& targets_T, int64_t vocab_start,
                                          int64_t vocab_total, const ReduceFn& all_reduce, Tensor& loss_T,
                                          Tensor& lse_T);

// The entry points above as one backend implements them (kernels/cpu/cross_entropy.cpp,
// kernels/cuda/kernels_loss_optim.cpp), each with the signature of the op it is named after; kernels/dispatch.cpp
// picks the table of the logits' device.
struct CrossEntropyKernels {
  void (*forward)(const Tensor& logits_TV, const Tensor& targets_T, Tensor& loss_T, Tensor& lse_T);
  void (*forward_vocab_parallel)(const Tensor& logits_TV, const Tensor& targets_T, int64_t vocab_start,
                                 int64_t vocab_total, const ReduceFn& all_reduce, Tensor& loss_T, Tensor& lse_T);
  void (*backward)(const Tensor& dloss_T, const Tensor& logits_TV, const Tensor& targets_T, const Tensor& lse_T,
                   Tensor& dlogits_TV, int64_t vocab_start);
  void (*forward_backward)(Tensor& logits_TV, const Tensor& targets_T, const Tensor& dloss_T, Tensor& loss_T,
                           Tensor& lse_T);
};

}  // namespace moecore::kernels
