// Megatron-Core's Sinkhorn load balancing (router.py sinkhorn_load_balancing, moe_utils.sinkhorn): in training the
// experts are chosen by the top-k of a doubly-normalised cost matrix, cost = exp(logits), whose rows (tokens) and
// columns (experts) are scaled alternately until the mean change of the column factors falls below `tol`:
//   d0_t = (1/T) / (Σ_e d1_e·cost_te + ε),  d1_e = (1/E) / (Σ_t d0_t·cost_te + ε),  ε = 1e-8,
//   result_te = d1_e · cost_te · d0_t.
// The probabilities routed with are not these but the score function of the logits (sigmoid for top-1, softmax
// otherwise; router.cpp). Selection only: no gradient flows through Sinkhorn.
// The column sums run over every token of `group` (the ranks sharing a micro-batch's tokens under sequence or
// context parallelism) and T counts them all, so the choice does not depend on the layout; Megatron normalises
// each sequence-parallel shard on its own (docs/differences.md). Computed in f64 whatever the router dtype.
#pragma once

#include "moecore/comm/process_group.h"
#include "moecore/core/tensor.h"

namespace moecore::moe {

// logits_TE [T, E] (F32 or F64, this rank's tokens, on either device) → [T, E] F64 normalised cost of this rank's
// tokens, on the host (computed there for GPU logits too: the CPU's bits).
Tensor sinkhorn_TE(const Tensor& logits_TE, const comm::ProcessGroup* group, double tol = 1e-4);

}  // namespace moecore::moe
