// The shared experts' gate on the CPU (see shared_gate.h): token by token, each row's sum in column order.
#include <cmath>

#include "moecore/kernels/backends.h"
#include "moecore/kernels/cpu/kernels.h"

namespace moecore::kernels::cpu {

void shared_gate_forward(Tensor& gate_T, const Tensor& m_TH, Tensor& y_TH) {
  const int64_t T = m_TH.rows(), H = m_TH.cols();
  MOE_ASSERT(gate_T.numel() == T && y_TH.numel() == T * H);
  MOE_ASSERT(gate_T.dtype() == m_TH.dtype() && y_TH.dtype() == m_TH.dtype());
  MOE_DISPATCH_FLOAT(m_TH.dtype(), F, {
    F* g = gate_T.data<F>();
    const F* mp = m_TH.data<F>();
    F* yp = y_TH.data<F>();
    for (int64_t t = 0; t < T; t++) {
      g[t] = F(1) / (F(1) + std::exp(-g[t]));
      for (int64_t h = 0; h < H; h++) yp[t * H + h] = mp[t * H + h] * g[t];
    }
  });
}

void shared_gate_backward(const Tensor& dy_TH, const Tensor& gate_T, const Tensor& m_TH, Tensor& dm_TH, Tensor& dz_T) {
  const int64_t T = m_TH.rows(), H = m_TH.cols();
  MOE_ASSERT(gate_T.numel() == T && dy_TH.numel() == T * H && dm_TH.numel() == T * H && dz_T.numel() == T);
  MOE_ASSERT(dy_TH.dtype() == m_TH.dtype() && gate_T.dtype() == m_TH.dtype());
  MOE_DISPATCH_FLOAT(dy_TH.dtype(), F, {
    const F* dy = dy_TH.data<F>();
    const F* g = gate_T.data<F>();
    const F* m = m_TH.data<F>();
    F* dmp = dm_TH.data<F>();
    F* dzp = dz_T.data<F>();
    for (int64_t t = 0; t < T; t++) {
      F s = 0;
      for (int64_t h = 0; h < H; h++) {
        dmp[t * H + h] = dy[t * H + h] * g[t];
        s += dy[t * H + h] * m[t * H + h];
      }
      dzp[t] = s * g[t] * (F(1) - g[t]);
    }
  });
}

// This backend's table (kernels/backends.h).
const SharedGateKernels kSharedGateKernels{shared_gate_forward, shared_gate_backward};

}  // namespace moecore::kernels::cpu
