// SGD with momentum (see sgd.h).
#include "moecore/optim/sgd.h"

#include "moecore/kernels/grad_clip.h"
#include "moecore/kernels/sgd_update.h"

namespace moecore::optim {

void sgd_step(Tensor& param, const Tensor& grad, Tensor& buf, const kernels::AdamWParams& hp, double momentum) {
  kernels::sgd_step(param, grad, buf, kernels::SgdParams{hp.lr, hp.weight_decay, momentum, hp.grad_scale});
}

void element_step_multi(const ElementRule& rule, std::vector<kernels::AdamWTensor>& tensors,
                        const kernels::AdamWParams& hp, int64_t step) {
  if (!rule.sgd) return kernels::adamw_step_multi(tensors, hp, step);
  kernels::sgd_step_multi(tensors, hp, rule.sgd_momentum);
}

}  // namespace moecore::optim
