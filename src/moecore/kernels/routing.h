// The MoE router's per-token ops, forward and backward (moe/router.cpp runs them in order, once for both devices):
// scores, top-k and probabilities; capacity dropping; the counts behind the statistics, the expert-bias update and
// the load-balancing losses; the backward of the score functions and of the z-loss. Not here: the gating GEMM
// (gemm.h), the loss formulas, the noise and the expert bias (moe/). Each op runs where its tensors live: on the CPU
// (kernels/cpu/routing.cpp) in the router dtype (f32 or f64), on a GPU (kernels/cuda/routing.cpp launching routing.cu's
// kernels) in f32; kernels/dispatch.cpp picks the backend's table (RouterKernels). Counts and sums are f64 in a fixed
// order: reruns give the same bits.
// Backward ops accumulate into dl_TE (+=) but router_score_backward, which writes it.
#pragma once

#include "moecore/core/tensor.h"

namespace moecore::kernels {

// The per-token routing rule (reference §1.1a).
struct RouterRule {
  int64_t K = 1;
  bool sigmoid = false;      // score function: sigmoid, else softmax
  bool pre_softmax = false;  // softmax over E before the top-k
  int64_t num_groups = 0;    // group-limited top-k when group_topk > 0
  int64_t group_topk = 0;
  double scale = 1.0;  // --moe-router-topk-scaling-factor (1 when none)
};

// Refuses, with the flag's name, what the backend of `device` cannot route: the CUDA backend takes no f64 router
// dtype. Called before the router's first op.
void router_check_backend(Device device, DType router_dtype);

// The tensors of router_rows, all on used_TE's device, in the router dtype unless noted; [T, K] and [T, E] shaped.
// Inputs are read, outputs allocated by the caller and written; an undefined optional output is not computed.
struct RouterRows {
  Tensor used_TE;      // in: the logits routed on
  Tensor bias_E;       // in, optional: f32 expert bias, added to the sigmoid scores for selection only
  Tensor sinkhorn_TE;  // in, optional: f64 balanced cost; the experts are its top-k, the probabilities the scores'
  Tensor logits_TE;    // in, optional: the real logits, whose logsumexp the z-loss takes (with lse_T)
  Tensor idx_TK;       // I32 selected experts, in selection order (ties to the lower index)
  Tensor p_TK;         // their probabilities before the scaling factor
  Tensor probs_TK;     // p · scale
  Tensor kept_TK;      // I32, set to 1 (capacity dropping clears it)
  Tensor scores_TE;    // softmax over E or sigmoid scores: required for sigmoid or pre-softmax, else undefined
  // Training only (optional):
  Tensor aux_scores_TE;  // softmax over E, or sigmoid normalised to sum 1 (reference §1.1b)
  Tensor aux_top_TK;     // I32 plain top-k of the aux scores (no bias, groups or dropping)
  Tensor lse_T;          // log Σ_e exp(logits_te)
  // f64 [2], optional: Σ_t −Σ_e a·log a over the aux scores (0 without them), Σ_t lse_t² (0 without lse_T).
  Tensor sums_2;
};
// Per token t: s = the scores of used_t; idx = top-K of the selection values (the sinkhorn cost, or s + bias for
// sigmoid, or s, group-limited when group_topk > 0: groups scored by the sum of their top K/group_topk values, the
// best group_topk kept); p = softmax of the selected logits (softmax), the selected s (pre-softmax), or the selected s
// renormalised over the K when K > 1 (sigmoid).
void router_rows(const RouterRule& rule, RouterRows& r);

// Capacity dropping (reference §1.2), per expert e of [0, E): it keeps C of its assignments, by probability (the C
// largest, ties to the earlier token; a zero one ranks after the positive ones in token order, and under `pad`
// among every token without a positive assignment to e, as Megatron ranks its padded capacity mask) or by position
// (the earliest C). A dropped assignment gets kept 0 and probs 0.
void router_capacity(const Tensor& idx_TK, Tensor& probs_TK, Tensor& kept_TK, int64_t E, int64_t C, bool by_position,
                     bool pad);
// ids_TK = kept ? idx : −1 (I32).
void router_mask_ids(const Tensor& idx_TK, const Tensor& kept_TK, Tensor& ids_TK);
// counts_E (f64) = #{i : ids[i] = e} over every id (−1 never counts).
void router_expert_counts(const Tensor& ids_TK, Tensor& counts_E);

// The load-balancing losses' counts: tokens fall into G classes (t mod G: the B sequences of seq_aux_loss, or 1).
//   cnt_GE[g, e] = Σ_{t ≡ g} Σ_j [top_TK[t, j] = e],  agg_GE[g, e] = Σ_{t ≡ g} a_TE[t, e]   (f64, [G·E])
void router_aux_counts(const Tensor& a_TE, const Tensor& top_TK, int64_t G, Tensor& cnt_GE, Tensor& agg_GE);
// da_TE[t, e] += coef_GE[(t mod G)·E + e] (coef_GE in da_TE's dtype and on its device: the gradient of a loss
// linear in the aux scores).
void router_add_class_coef(Tensor& da_TE, const Tensor& coef_GE);

// a *= u elementwise (the jitter on the gating input, and on its gradient).
void router_mul_(Tensor& a, const Tensor& u);

// Backward of router_rows' probabilities into dl_TE (overwritten) from dprobs_TK, the gradient of probs (dropped
// assignments, kept 0, carry none); idx, kept, p and scores as forward left them. Derivations in
// kernels/cpu/routing.cpp.
void router_score_backward(const RouterRule& rule, const Tensor& dprobs_TK, const Tensor& idx_TK, const Tensor& kept_TK,
                           const Tensor& p_TK, const Tensor& scores_TE, Tensor& dl_TE);
// dl_TE += scale · (d aux scores / d used)ᵀ · da_TE, through the aux scores a_TE of the logits used_TE.
void router_aux_score_backward(bool sigmoid, const Tensor& used_TE, const Tensor& a_TE, const Tensor& da_TE,
                               double scale, Tensor& dl_TE);
// dl_TE[t, e] += f · lse_T[t] · exp(logits_TE[t, e] − lse_T[t]) (f rounded to the router dtype).
void router_z_loss_backward(const Tensor& logits_TE, const Tensor& lse_T, double f, Tensor& dl_TE);

// The ops above as one backend implements them (kernels/cpu/routing.cpp, kernels/cuda/routing.cpp), each with the
// signature of the op it is named after; check_backend is router_check_backend's refusal for that backend.
struct RouterKernels {
  void (*check_backend)(DType router_dtype);
  void (*rows)(const RouterRule& rule, RouterRows& r);
  void (*capacity)(const Tensor& idx_TK, Tensor& probs_TK, Tensor& kept_TK, int64_t E, int64_t C, bool by_position,
                   bool pad);
  void (*mask_ids)(const Tensor& idx_TK, const Tensor& kept_TK, Tensor& ids_TK);
  void (*expert_counts)(const Tensor& ids_TK, Tensor& counts_E);
  void (*aux_counts)(const Tensor& a_TE, const Tensor& top_TK, int64_t G, Tensor& cnt_GE, Tensor& agg_GE);
  void (*add_class_coef)(Tensor& da_TE, const Tensor& coef_GE);
  void (*mul_)(Tensor& a, const Tensor& u);
  void (*score_backward)(const RouterRule& rule, const Tensor& dprobs_TK, const Tensor& idx_TK, const Tensor& kept_TK,
                         const Tensor& p_TK, const Tensor& scores_TE, Tensor& dl_TE);
  void (*aux_score_backward)(bool sigmoid, const Tensor& used_TE, const Tensor& a_TE, const Tensor& da_TE, double scale,
                             Tensor& dl_TE);
  void (*z_loss_backward)(const Tensor& logits_TE, const Tensor& lse_T, double f, Tensor& dl_TE);
};

}  // namespace moecore::kernels
