// SGD with momentum as Megatron builds it (torch.optim.SGD(lr, weight_decay, momentum); no dampening, no
// Nesterov; the update itself is kernels/sgd_update.h, on either device): d = g + wd·p (L2 weight decay added to the
// gradient), buf ← momentum·buf + d, p ← p − lr·buf, with g = grad_scale · grad (clipping). And the elementwise
// rule the AdamW and sharded optimizers apply per parameter (or per owned range): AdamW or SGD.
#pragma once

#include "moecore/core/tensor.h"
#include "moecore/kernels/adamw_update.h"

namespace moecore::optim {

struct ElementRule {
  bool sgd = false;           // false: AdamW
  double sgd_momentum = 0.9;  // --sgd-momentum
  // AdamW's moments stored in bf16 (--use-precision-aware-optimizer --exp-avg-dtype / --exp-avg-sq-dtype bf16);
  // otherwise in the parameters' dtype.
  bool bf16_exp_avg = false, bf16_exp_avg_sq = false;
  DType exp_avg_dtype(DType param) const { return bf16_exp_avg ? DType::BF16 : param; }
  DType exp_avg_sq_dtype(DType param) const { return bf16_exp_avg_sq ? DType::BF16 : param; }
};

// p and buf updated in place, grad read; lr, weight_decay and grad_scale from hp. Same floating dtype.
void sgd_step(Tensor& param, const Tensor& grad, Tensor& buf, const kernels::AdamWParams& hp, double momentum);

// AdamW (m, v the moments) or SGD (m the momentum buffer, v untouched) over many tensors, each with its own weight
// decay, in one multi-tensor pass (kernels/adamw_update.h, kernels/grad_clip.h). step ≥ 1.
void element_step_multi(const ElementRule& rule, std::vector<kernels::AdamWTensor>& tensors,
                        const kernels::AdamWParams& hp, int64_t step);

}  // namespace moecore::optim
