// The three GEMMs of one FP8 site (a Linear, or one expert's projection) with their operands quantized by the
// site's recipe (fp8_recipe.h) and multiplied in f32, as an FP8 tensor-core GEMM with f32 accumulation computes
// them. What is quantized, as TransformerEngine does it: forward y = Q(x)·Q(W)ᵀ; data gradient dx = Q(dy)·Q(W);
// weight gradient dW = Q(dy)ᵀ·Q(x), where blockwise casts dy and x again with tiles along the token dimension (the
// weight gradient's reduction), the per-tensor recipes reuse the forward's casts. Not the choice of sites (fp8_recipe).
#pragma once

#include "moecore/nn/fp8_recipe.h"

namespace moecore::nn {

// x_MK (f32 or bf16), w_NK (f32 or bf16) -> y_MN (f32 or bf16, written). wq_NK receives Q(W) for the backward; returns
// x's scale.
float fp8_forward(Fp8Gemm& g, const Tensor& x_MK, const Tensor& w_NK, Tensor& y_MN, Tensor& wq_NK);

// dx_MK = beta·dx_MK + Q(dy)·Q(W) (dx f32, or bf16 with beta 0); dW_NK = grad_beta·dW_NK + Q(dy)ᵀ·Q(x), where x_MK is
// the input forward saw and x_scale the scale forward returned.
void fp8_backward(Fp8Gemm& g, const Tensor& dy_MN, const Tensor& x_MK, float x_scale, const Tensor& wq_NK,
                  Tensor& dx_MK, float beta, Tensor& dW_NK, float grad_beta);

}  // namespace moecore::nn
