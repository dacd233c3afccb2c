// The router's ops (see router.h): the one place that picks a backend for each, by where its tensors live.
#include "moecore/kernels/router.h"

#include "moecore/kernels/cpu/router.h"
#include "moecore/kernels/cuda/router_ops.h"

namespace moecore::kernels {

void router_check_backend(Device device, DType router_dtype) {
  if (device.is_cuda()) cuda::router_check_backend(router_dtype);
}

void router_rows(const RouterRule& rule, RouterRows& r) {
  if (r.used_TE.device().is_cuda()) return cuda::router_rows(rule, r);
  cpu::router_rows(rule, r);
}

void router_capacity(const Tensor& idx_TK, Tensor& probs_TK, Tensor& kept_TK, int64_t E, int64_t C, bool by_position,
                     bool pad) {
  if (idx_TK.device().is_cuda()) return cuda::router_capacity(idx_TK, probs_TK, kept_TK, E, C, by_position, pad);
  cpu::router_capacity(idx_TK, probs_TK, kept_TK, E, C, by_position, pad);
}

void router_mask_ids(const Tensor& idx_TK, const Tensor& kept_TK, Tensor& ids_TK) {
  if (idx_TK.device().is_cuda()) return cuda::router_mask_ids(idx_TK, kept_TK, ids_TK);
  cpu::router_mask_ids(idx_TK, kept_TK, ids_TK);
}

void router_expert_counts(const Tensor& ids_TK, Tensor& counts_E) {
  if (ids_TK.device().is_cuda()) return cuda::router_expert_counts(ids_TK, counts_E);
  cpu::router_expert_counts(ids_TK, counts_E);
}

void router_aux_counts(const Tensor& a_TE, const Tensor& top_TK, int64_t G, Tensor& cnt_GE, Tensor& agg_GE) {
  if (a_TE.device().is_cuda()) return cuda::router_aux_counts(a_TE, top_TK, G, cnt_GE, agg_GE);
  cpu::router_aux_counts(a_TE, top_TK, G, cnt_GE, agg_GE);
}

void router_add_class_coef(Tensor& da_TE, const Tensor& coef_GE) {
  if (da_TE.device().is_cuda()) return cuda::router_add_class_coef(da_TE, coef_GE);
  cpu::router_add_class_coef(da_TE, coef_GE);
}

void router_mul_(Tensor& a, const Tensor& u) {
  if (a.device().is_cuda()) return cuda::router_mul_(a, u);
  cpu::router_mul_(a, u);
}

void router_score_backward(const RouterRule& rule, const Tensor& dprobs_TK, const Tensor& idx_TK, const Tensor& kept_TK,
                           const Tensor& p_TK, const Tensor& scores_TE, Tensor& dl_TE) {
  if (dl_TE.device().is_cuda())
    return cuda::router_score_backward(rule, dprobs_TK, idx_TK, kept_TK, p_TK, scores_TE, dl_TE);
  cpu::router_score_backward(rule, dprobs_TK, idx_TK, kept_TK, p_TK, scores_TE, dl_TE);
}

void router_aux_score_backward(bool sigmoid, const Tensor& used_TE, const Tensor& a_TE, const Tensor& da_TE,
                               double scale, Tensor& dl_TE) {
  if (dl_TE.device().is_cuda()) return cuda::router_aux_score_backward(sigmoid, used_TE, a_TE, da_TE, scale, dl_TE);
  cpu::router_aux_score_backward(sigmoid, used_TE, a_TE, da_TE, scale, dl_TE);
}

void router_z_loss_backward(const Tensor& logits_TE, const Tensor& lse_T, double f, Tensor& dl_TE) {
  if (dl_TE.device().is_cuda()) return cuda::router_z_loss_backward(logits_TE, lse_T, f, dl_TE);
  cpu::router_z_loss_backward(logits_TE, lse_T, f, dl_TE);
}

}  // namespace moecore::kernels
