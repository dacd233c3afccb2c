// SGD with momentum on the CPU (see kernels/sgd_update.h). Compiled for the baseline ISA, which has no fused
// multiply-add: each product and sum rounds on its own, as the CUDA kernel computes them.
#include "moecore/core/cpu.h"
#include "moecore/kernels/backends.h"
#include "moecore/kernels/cpu/kernels.h"

namespace moecore::kernels::cpu {

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

void sgd_step(Tensor& param, const Tensor& grad, Tensor& buf, const SgdParams& hp) {
  require_cpu(param, "sgd_step");
  MOE_ASSERT(param.numel() == grad.numel() && param.numel() == buf.numel());
  MOE_ASSERT(param.dtype() == grad.dtype() && param.dtype() == buf.dtype());
  MOE_DISPATCH_FLOAT(param.dtype(), T, {
    update<T>(param.data<T>(), grad.data<T>(), buf.data<T>(), param.numel(), T(hp.lr), T(hp.weight_decay),
              T(hp.momentum), T(hp.grad_scale));
  });
}

// This backend's table (kernels/backends.h).
const OptimizerKernels kOptimizerKernels{adamw_step, adamw_step_multi, sgd_step};

}  // namespace moecore::kernels::cpu
