// SGD with momentum (see sgd.h).
#include "moecore/optim/sgd.h"

#include "moecore/core/cpu.h"

namespace moecore::optim {

namespace {
template <typename T>
void update(T* p, const T* g, T* buf, int64_t n, T lr, T wd, T mom, T gs) {
#pragma omp parallel for schedule(static) if (n > 16384)
  for (int64_t i = 0; i < n; i++) {
    const T d = g[i] * gs + wd * p[i];
    buf[i] = mom * buf[i] + d;
    p[i] = p[i] - lr * buf[i];
  }
}
}  // namespace

void sgd_step(Tensor& param, const Tensor& grad, Tensor& buf, const kernels::AdamWParams& hp, double momentum) {
  MOE_ASSERT(param.numel() == grad.numel() && param.numel() == buf.numel());
  MOE_ASSERT(param.dtype() == grad.dtype() && param.dtype() == buf.dtype());
  MOE_DISPATCH_FLOAT(param.dtype(), T, {
    update<T>(param.data<T>(), grad.data<T>(), buf.data<T>(), param.numel(), T(hp.lr), T(hp.weight_decay), T(momentum),
              T(hp.grad_scale));
  });
}

void element_step_multi(const ElementRule& rule, std::vector<kernels::AdamWTensor>& tensors,
                        const kernels::AdamWParams& hp, int64_t step) {
  if (!rule.sgd) return kernels::adamw_step_multi(tensors, hp, step);
  for (auto& x : tensors) {
    kernels::AdamWParams h = hp;
    h.weight_decay = x.weight_decay;
    sgd_step(x.param, x.grad, x.m, h, rule.sgd_momentum);
  }
}

}  // namespace moecore::optim
