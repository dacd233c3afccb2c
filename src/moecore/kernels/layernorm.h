// LayerNorm over the last dimension: y = (x − mean)·rstd·w + b, rstd = 1/sqrt(var + eps), var the biased variance.
// Not RMSNorm (rmsnorm.h). Backward writes dx and accumulates dw and db (+=), as every backward here does for
// parameter gradients.
#pragma once

#include "moecore/core/tensor.h"

namespace moecore::kernels {

// x_TH [T, H], w_H [H], b_H [H] -> y_TH [T, H], mean_T and rstd_T [T] (kept for backward). Rows may be any leading
// shape. y_TH may be bf16 for an f32 x_TH: rounded as it is written (see rmsnorm_forward).
void layernorm_forward(const Tensor& x_TH, const Tensor& w_H, const Tensor& b_H, double eps, Tensor& y_TH,
                       Tensor& mean_T, Tensor& rstd_T);
// The residual add before the norm fused into it: x_TH += res_TH, then layernorm_forward(x_TH, ...) (same bits).
void layernorm_forward_add(Tensor& x_TH, const Tensor& res_TH, const Tensor& w_H, const Tensor& b_H, double eps,
                           Tensor& y_TH, Tensor& mean_T, Tensor& rstd_T);
// dy_TH -> dx_TH (written; plus dres_TH when given, as rmsnorm_backward), dw_H and db_H (accumulated). x_TH may be
// bf16 for f32 dy and dx, read widened (as rmsnorm_backward).
void layernorm_backward(const Tensor& dy_TH, const Tensor& x_TH, const Tensor& w_H, const Tensor& mean_T,
                        const Tensor& rstd_T, Tensor& dx_TH, Tensor& dw_H, Tensor& db_H,
                        const Tensor* dres_TH = nullptr);

// The norms, this header's and rmsnorm.h's, as one backend implements them (kernels/cpu/layernorm.cpp,
// kernels/cuda/kernels.cpp), each with the signature of the op it is named after; kernels/dispatch.cpp picks the
// table of the input rows' device.
struct NormKernels {
  void (*rmsnorm_forward)(const Tensor& x_TH, const Tensor& w_H, double eps, Tensor& y_TH, Tensor& rstd_T);
  void (*rmsnorm_forward_add)(Tensor& x_TH, const Tensor& res_TH, const Tensor& w_H, double eps, Tensor& y_TH,
                              Tensor& rstd_T);
  void (*rmsnorm_backward)(const Tensor& dy_TH, const Tensor& x_TH, const Tensor& w_H, const Tensor& rstd_T,
                           Tensor& dx_TH, Tensor& dw_H, const Tensor* dres_TH);
  void (*layernorm_forward)(const Tensor& x_TH, const Tensor& w_H, const Tensor& b_H, double eps, Tensor& y_TH,
                            Tensor& mean_T, Tensor& rstd_T);
  void (*layernorm_forward_add)(Tensor& x_TH, const Tensor& res_TH, const Tensor& w_H, const Tensor& b_H, double eps,
                                Tensor& y_TH, Tensor& mean_T, Tensor& rstd_T);
  void (*layernorm_backward)(const Tensor& dy_TH, const Tensor& x_TH, const Tensor& w_H, const Tensor& mean_T,
                             const Tensor& rstd_T, Tensor& dx_TH, Tensor& dw_H, Tensor& db_H, const Tensor* dres_TH);
};

}  // namespace moecore::kernels
