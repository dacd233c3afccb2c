// The router's gating linear (see router.h), written once for both devices: logits = x_r·Wᵀ (+ b) in the router
// dtype, and its parameters' gradients. Not the input gradient (the backward may add it into the caller's sum) and
// not the scores or the selection (router.cpp over kernels/routing.h).
#include "moecore/kernels/elementwise.h"
#include "moecore/kernels/gemm.h"
#include "moecore/moe/router.h"

namespace moecore::moe {

void Router::gating_forward(Stash& st) const {
  const DType rd = cfg_.router_dtype;
  st.logits_TE = Tensor::empty({st.x_r.rows(), cfg_.num_experts}, rd, st.x_r.device());
  kernels::gemm(st.x_r, false, weight_->value.as_dtype(rd), true, st.logits_TE);
  if (bias_) kernels::add_row_bias_(st.logits_TE, bias_->value.as_dtype(rd));
}

// l = x_r·Wᵀ + 1·b: dW += dlᵀ·x_r and db += 1ᵀ·dl (∂l[t, e]/∂b[e] = 1), in the router dtype, then added to the
// gradients in theirs.
void Router::gating_param_grads(const Tensor& dl_TE, const Stash& st) {
  const DType rd = cfg_.router_dtype;
  const Device dev = dl_TE.device();
  const Tensor x_r = st.x_r.as_dtype(rd);  // a bf16 kept input (--bf16) widened to the router dtype
  if (weight_->grad.dtype() == rd) {
    kernels::gemm(dl_TE, true, x_r, false, weight_->grad, 1.0f, weight_->take_grad_beta());
  } else {
    Tensor dw = Tensor::empty(weight_->grad.shape(), rd, dev);
    kernels::gemm(dl_TE, true, x_r, false, dw);
    kernels::add_(weight_->grad_to_add(), dw.to(weight_->grad.dtype()));
  }
  if (!bias_) return;
  if (bias_->grad.dtype() == rd) {
    kernels::accumulate_col_sums(dl_TE, bias_->grad_to_add());
  } else {
    Tensor db = Tensor::zeros(bias_->grad.shape(), rd, dev);
    kernels::accumulate_col_sums(dl_TE, db);
    kernels::add_(bias_->grad_to_add(), db.to(bias_->grad.dtype()));
  }
}

}  // namespace moecore::moe
