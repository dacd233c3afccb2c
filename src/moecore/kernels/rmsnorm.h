// RMSNorm over the last dimension: y = x · rstd · w, rstd = 1/sqrt(mean(x²) + eps).
// Backward writes dx and accumulates dw (+=), as every backward here does for parameter gradients.
#pragma once

#include "moecore/core/tensor.h"

namespace moecore::kernels {

// x_TH [T, H], w_H [H] -> y_TH [T, H], rstd_T [T] (kept for backward). Rows may be any leading shape.
// y_TH may be bf16 for an f32 x_TH: the rows are rounded as they are written (Tensor::to's rounding), for a bf16 GEMM
// that reads them, instead of a separate cast pass.
void rmsnorm_forward(const Tensor& x_TH, const Tensor& w_H, double eps, Tensor& y_TH, Tensor& rstd_T);
// The residual add before a norm fused into it: x_TH += res_TH, then rmsnorm_forward(x_TH, ...), one pass over each
// row with the same bits as add_ followed by rmsnorm_forward.
void rmsnorm_forward_add(Tensor& x_TH, const Tensor& res_TH, const Tensor& w_H, double eps, Tensor& y_TH,
                         Tensor& rstd_T);
// dy_TH -> dx_TH (written), dw_H (accumulated). dres_TH (optional, shape of dx): the residual branch's gradient,
// added to each element of dx as it is written (the same bits as add_ after the call). x_TH may be bf16 for f32 dy
// and dx (an input kept rounded for backward under --bf16): read widened.
void rmsnorm_backward(const Tensor& dy_TH, const Tensor& x_TH, const Tensor& w_H, const Tensor& rstd_T, Tensor& dx_TH,
                      Tensor& dw_H, const Tensor* dres_TH = nullptr);

}  // namespace moecore::kernels
