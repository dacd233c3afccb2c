// The learned position embedding's row ops on the GPU at the Tensor level (kernels/position_rows.h; the dispatch code
// calls these for GPU tensors; a CPU-only build answers them in kernels/cuda/position_rows_unavailable.cpp).
#pragma once

#include "moecore/core/tensor.h"

namespace moecore::kernels::cuda {

// f32.
void position_add_rows(Tensor& h_nBH, const Tensor& table_nH);
void position_sum_rows(const Tensor& dh_nBH, Tensor& grad_nH);

}  // namespace moecore::kernels::cuda
