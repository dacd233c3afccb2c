// The learned position embedding's two row ops (nn/position_embedding.cpp): a slice of the table added to every
// sequence of a batch, and its gradient summed over the batch. f32 or f64; the GPU's kernels (f32) add in the CPU
// loop's order, so both give the same bits.
#pragma once

#include "moecore/core/tensor.h"

namespace moecore::kernels {

// h_nBH [n, B, H] += table_nH [n, H] broadcast over B.
void position_add_rows(Tensor& h_nBH, const Tensor& table_nH);
// grad_nH [n, H] += Σ_b dh_nBH [n, b, H], b ascending.
void position_sum_rows(const Tensor& dh_nBH, Tensor& grad_nH);

// The entry points above as one backend implements them (kernels/cpu/position_rows.cpp,
// kernels/cuda/position_rows.cpp); kernels/dispatch.cpp picks the table of the rows' device.
struct PositionRowsKernels {
  void (*add_rows)(Tensor& h_nBH, const Tensor& table_nH);
  void (*sum_rows)(const Tensor& dh_nBH, Tensor& grad_nH);
};

}  // namespace moecore::kernels
