// AdamW update (see adamw.h).
#include "moecore/kernels/cpu/adamw.h"

#include <cmath>

#include "moecore/core/cpu.h"
#include "moecore/kernels/cuda/kernels.h"

namespace moecore::kernels {

namespace {
template <typename T>
MOE_TARGET_CLONES void update(T* p, const T* g, T* m, T* v, int64_t n, T lr, T b1, T b2, T eps, T wd, T bc1, T bc2,
                              T gs) {
#pragma omp parallel for schedule(static) if (n > 16384)
  for (int64_t i = 0; i < n; i++) {
    const T gi = g[i] * gs;
    m[i] = b1 * m[i] + (T(1) - b1) * gi;
    v[i] = b2 * v[i] + (T(1) - b2) * gi * gi;
    const T mhat = m[i] / bc1;
    const T vhat = v[i] / bc2;
    p[i] = p[i] * (T(1) - lr * wd) - lr * mhat / (std::sqrt(vhat) + eps);
  }
}
}  // namespace

void adamw_step(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWParams& hp, int64_t step) {
  if (param.device().is_cuda()) return cuda::adamw_step(param, grad, m, v, hp, step);
  MOE_ASSERT(step >= 1);
  MOE_ASSERT(param.numel() == grad.numel() && param.numel() == m.numel() && param.numel() == v.numel());
  MOE_ASSERT(param.dtype() == grad.dtype() && param.dtype() == m.dtype() && param.dtype() == v.dtype());
  const double bc1 = 1.0 - std::pow(hp.beta1, static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(hp.beta2, static_cast<double>(step));
  MOE_DISPATCH_FLOAT(param.dtype(), T, {
    update<T>(param.data<T>(), grad.data<T>(), m.data<T>(), v.data<T>(), param.numel(), T(hp.lr), T(hp.beta1),
              T(hp.beta2), T(hp.eps), T(hp.weight_decay), T(bc1), T(bc2), T(hp.grad_scale));
  });
}

}  // namespace moecore::kernels
