// RMSNorm over the last dimension: y = x · rstd · w, rstd = 1/sqrt(mean(x²) + eps).
// Backward writes dx and accumulates dw (+=), as every backward here does for parameter gradients.
#pragma once

#include "moecore/core/tensor.h"

namespace moecore::kernels {

// x_TH [T, H], w_H [H] -> y_TH [T, H], rstd_T [T] (kept for backward). Rows may be any leading shape.
void rmsnorm_forward(const Tensor& x_TH, const Tensor& w_H, double eps, Tensor& y_TH, Tensor& rstd_T);
// dy_TH -> dx_TH (written), dw_H (accumulated).
void rmsnorm_backward(const Tensor& dy_TH, const Tensor& x_TH, const Tensor& w_H, const Tensor& rstd_T, Tensor& dx_TH,
                      Tensor& dw_H);

}  // namespace moecore::kernels
