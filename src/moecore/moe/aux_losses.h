// Megatron-Core's load-balancing losses and the router z-loss (reference §1.1b), one function per Megatron
// `_apply_*` method: each returns its value L (coefficient included) and adds the gradient it injects. Like Megatron,
// the losses are "identity forward, scaled gradient": they never enter the LM loss; the router adds their gradients
// on the aux scores (aux losses) or logits (z-loss) in backward, scaled by the micro-batch's loss scale.
// One formulation for both devices: the per-class counts and aux-score sums come from kernels::router_aux_counts on
// the aux scores' device and are copied to the host ([E], or [B·E] for seq_aux_loss), where the counts are summed
// over the group and the loss is formed in f64; its gradient, linear in the aux scores, goes back as [E] (or [B·E])
// coefficients (kernels::router_add_class_coef).
// Not here: the aux scores themselves and the score-function backward (kernels/routing.h).
#pragma once

#include "moecore/comm/process_group.h"
#include "moecore/core/tensor.h"

namespace moecore::moe {

// Ranks in a count or global group (1 for none): what the losses' token counts T are multiplied by.
int64_t group_size(const comm::ProcessGroup* g);

// Shared inputs: a_TE [T, E] the aux scores (router dtype: softmax, or sigmoid normalized over E); top_TK [T, K]
// (I32) the plain top-k of the aux scores, from which every count c is taken (no bias, groups or dropping);
// da_TE [T, E] (router dtype) the gradient on the aux scores, accumulated (+=). Counts are f64 (exact).

// aux_loss (Megatron _apply_aux_loss, switch_load_balancing_loss_func), over this micro-batch:
//   L = coeff·E/(K·T²) · Σ_e (Σ_t a_te)·c_e,  c_e = Σ_t [e ∈ top_t], both summed over count_group (TP×CP), whose
//   T counts all of its ranks' tokens (each rank holds its tokens' share of L).
//   dL/da_te = coeff·E/(K·T²) · c_e
double aux_loss(const Tensor& a_TE, const Tensor& top_TK, double coeff, const comm::ProcessGroup* count_group,
                Tensor& da_TE);

// seq_aux_loss (Megatron _apply_seq_aux_loss, sequence_load_balancing_loss_func): every (sequence b, expert e) pair
// is an expert of its own; token t = s·B + b belongs to sequence b, whose S tokens span count_group's ranks:
//   L = coeff·E/(K·S²·B) · Σ_b Σ_e (Σ_{t∈b} a_te)·c_be,  S the whole sequence (S·#count_group)
//   dL/da_te = coeff·E/(K·S²·B) · c_{b(t) e}
double seq_aux_loss(const Tensor& a_TE, const Tensor& top_TK, int64_t S, int64_t B, double coeff,
                    const comm::ProcessGroup* count_group, Tensor& da_TE);

// Counts global_aux_loss accumulates over the micro-batches of one global batch (reset at its end).
struct GlobalAuxCounts {
  Tensor tokens_E;  // f64 Σ over micro-batches of the counts summed over global_group
  int64_t micro_batches = 0;
};

// global_aux_loss (Megatron _apply_global_aux_loss): the counts are summed over global_group (TP×DP×CP) and
// averaged over the micro-batches so far (c̄ = running mean), T counts all of the group's tokens:
//   L = coeff·E/(K·T²) · Σ_e (Σ_t a_te)·c̄_e
//   dL/da_te = grad_scale · coeff·E/(K·T²) · c̄_e
// grad_scale is DP, so that data-parallel gradient averaging leaves the global loss's gradient (Megatron's 1/DP
// weakening, upstream issue #3672, is not reproduced). Returns L unscaled; the loss a rank differentiates is
// grad_scale·L.
double global_aux_loss(const Tensor& a_TE, const Tensor& top_TK, double coeff, const comm::ProcessGroup* global_group,
                       double grad_scale, GlobalAuxCounts& acc, Tensor& da_TE);

// z-loss (Megatron _apply_z_loss, z_loss_func) on the real logits l_TE [T, E], over the tokens of `ranks` ranks
// (count_group) of which this rank holds T, from Σ_t lse_t² (kernels::router_rows computes lse_T and the sum):
//   z = coeff/(T·ranks) · Σ_t lse_t²,  lse_t = log Σ_e exp(l_te);  lse_T [T] (router dtype) is kept for backward.
double z_loss(double lse_sq_sum, int64_t T, double coeff, int64_t ranks);
//   dz/dl_te = coeff · 2·lse_t/(T·ranks) · softmax(l_t)_e, times grad_scale, added to dlogits_TE.
void z_loss_backward(const Tensor& logits_TE, const Tensor& lse_T, double coeff, int64_t ranks, double grad_scale,
                     Tensor& dlogits_TE);

}  // namespace moecore::moe
