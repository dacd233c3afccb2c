// The shared-expert gate on the GPU at the Tensor level (kernels/shared_gate.h; the dispatch code calls these for GPU
// tensors; a CPU-only build answers them in kernels/cuda/shared_gate_unavailable.cpp).
#pragma once

#include "moecore/core/tensor.h"

namespace moecore::kernels::cuda {

// f32; the backward's row sums in a fixed tree.
void shared_gate_forward(Tensor& gate_T, const Tensor& m_TH, Tensor& y_TH);
void shared_gate_backward(const Tensor& dy_TH, const Tensor& gate_T, const Tensor& m_TH, Tensor& dm_TH, Tensor& dz_T);

}  // namespace moecore::kernels::cuda
