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

void element_step(const ElementRule& rule, Tensor& param, const Tensor& grad, Tensor& m, Tensor& v,
                  const kernels::AdamWParams& hp, int64_t step) {
  if (rule.sgd)
    sgd_step(param, grad, m, hp, rule.sgd_momentum);
  else
    kernels::adamw_step(param, grad, m, v, hp, step);
}

}  // namespace moecore::optim
