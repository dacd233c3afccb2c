// The CPU backend of the router's ops (kernels/router.h, where each op is specified): f32 or f64, the router dtype.
// kernels/router.cpp calls these for CPU tensors.
#pragma once

#include "moecore/kernels/router.h"

namespace moecore::kernels::cpu {

void router_rows(const RouterRule& rule, RouterRows& r);
void router_capacity(const Tensor& idx_TK, Tensor& probs_TK, Tensor& kept_TK, int64_t E, int64_t C, bool by_position,
                     bool pad);
void router_mask_ids(const Tensor& idx_TK, const Tensor& kept_TK, Tensor& ids_TK);
void router_expert_counts(const Tensor& ids_TK, Tensor& counts_E);
void router_aux_counts(const Tensor& a_TE, const Tensor& top_TK, int64_t G, Tensor& cnt_GE, Tensor& agg_GE);
void router_add_class_coef(Tensor& da_TE, const Tensor& coef_GE);
void router_mul_(Tensor& a, const Tensor& u);
void router_score_backward(const RouterRule& rule, const Tensor& dprobs_TK, const Tensor& idx_TK, const Tensor& kept_TK,
                           const Tensor& p_TK, const Tensor& scores_TE, Tensor& dl_TE);
void router_aux_score_backward(bool sigmoid, const Tensor& used_TE, const Tensor& a_TE, const Tensor& da_TE,
                               double scale, Tensor& dl_TE);
void router_z_loss_backward(const Tensor& logits_TE, const Tensor& lse_T, double f, Tensor& dl_TE);

}  // namespace moecore::kernels::cpu
