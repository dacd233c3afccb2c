// The shared experts' gate (moe/shared_experts.cpp, Megatron's --moe-shared-expert-gate): with g_t = σ(z_t) of the
// gate's logit z_t and m = the shared MLP's output, y_t = m_t·g_t; backward dm_t = dy_t·g_t and
// dz_t = (Σ_h dy_th·m_th)·g_t·(1 − g_t). The gate's GEMMs stay in the module.
#pragma once

#include "moecore/core/tensor.h"

namespace moecore::kernels {

// gate_T [T, 1]: logits in, σ(logits) out (kept for backward); y_TH = m_TH ⊙ gate.
void shared_gate_forward(Tensor& gate_T, const Tensor& m_TH, Tensor& y_TH);
// dm_TH = dy ⊙ gate (written); dz_T = (Σ_h dy·m)·gate·(1 − gate) (written).
void shared_gate_backward(const Tensor& dy_TH, const Tensor& gate_T, const Tensor& m_TH, Tensor& dm_TH, Tensor& dz_T);

// The entry points above as one backend implements them (kernels/cpu/shared_gate.cpp, kernels/cuda/shared_gate.cpp);
// kernels/dispatch.cpp picks the table of the rows' device.
struct SharedGateKernels {
  void (*forward)(Tensor& gate_T, const Tensor& m_TH, Tensor& y_TH);
  void (*backward)(const Tensor& dy_TH, const Tensor& gate_T, const Tensor& m_TH, Tensor& dm_TH, Tensor& dz_T);
};

}  // namespace moecore::kernels
