// The learned position embedding on the GPU at the Tensor level (nn/position_embedding.cpp calls these for GPU
// tensors; a CPU-only build answers them in kernels/cuda/position_rows_unavailable.cpp).
#pragma once

#include "moecore/core/tensor.h"

namespace moecore::kernels::cuda {

// h_nBH [n, B, H] += table_nH [n, H] broadcast over B.
void position_add_rows(Tensor& h_nBH, const Tensor& table_nH);
// grad_nH [n, H] += Σ_b dh_nBH [n, b, H], b ascending.
void position_sum_rows(const Tensor& dh_nBH, Tensor& grad_nH);

}  // namespace moecore::kernels::cuda
