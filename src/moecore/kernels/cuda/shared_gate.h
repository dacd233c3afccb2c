// The shared-expert gate on the GPU at the Tensor level (moe/shared_experts.cpp calls these for GPU tensors; a
// CPU-only build answers them in kernels/cuda/shared_gate_unavailable.cpp).
#pragma once

#include "moecore/core/tensor.h"

namespace moecore::kernels::cuda {

// gate_T [T, 1]: logits in, σ(logits) out; y_TH = m_TH ⊙ gate.
void shared_gate_forward(Tensor& gate_T, const Tensor& m_TH, Tensor& y_TH);
// dm_TH = dy ⊙ gate; dz_T = (Σ_h dy·m)·gate·(1 − gate).
void shared_gate_backward(const Tensor& dy_TH, const Tensor& gate_T, const Tensor& m_TH, Tensor& dm_TH, Tensor& dz_T);

}  // namespace moecore::kernels::cuda
