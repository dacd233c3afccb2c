// Rotary position embedding (Megatron's non-interleaved "rotate half" form) on the first rot_dim channels of each
// head; the rest pass through. inv_freq_i = base^(−2i/rot_dim), angle = position · inv_freq_i.
#pragma once

#include "moecore/core/tensor.h"

namespace moecore::kernels {

// cos_SR, sin_SR: [S, rot_dim/2] for positions 0..S-1, computed in f64 and stored in `dtype`.
void rope_tables(int64_t S, int64_t rot_dim, double base, DType dtype, Tensor& cos_SR, Tensor& sin_SR);
// x_SBND [S, B, N, D] -> y_SBND (may alias x). Tables need at least S rows.
void rope_forward(const Tensor& x_SBND, const Tensor& cos_SR, const Tensor& sin_SR, int64_t rot_dim, Tensor& y_SBND);
// dy_SBND -> dx_SBND (written; may alias dy).
void rope_backward(const Tensor& dy_SBND, const Tensor& cos_SR, const Tensor& sin_SR, int64_t rot_dim, Tensor& dx_SBND);

}  // namespace moecore::kernels
