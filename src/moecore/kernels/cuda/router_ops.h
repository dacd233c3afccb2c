// The CUDA backend of the router's ops (kernels/router.h, where each op is specified) at the Tensor level, over the
// launchers of launch_router.h: f32 tensors, I32 ids, f64 counts and sums, all on one GPU. Plain host declarations
// (no CUDA headers); a CPU-only build defines them in router_ops_unavailable.cpp, where they throw (no CUDA tensor
// can exist there). kernels/router.cpp calls these for GPU tensors.
#pragma once

#include "moecore/kernels/router.h"

namespace moecore::kernels::cuda {

// f64 router dtype and Sinkhorn selection: refused with the flag's name (the GPU router computes in f32 and has no
// Sinkhorn).
void router_check_backend(DType router_dtype, bool sinkhorn);
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

}  // namespace moecore::kernels::cuda
