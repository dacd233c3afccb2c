// FP8 GEMM sites (see fp8_gemm.h): y = x·Wᵀ  =>  dx = dy·W,  dW = dyᵀ·x, each operand quantized first.
#include "moecore/nn/fp8_gemm.h"

#include "moecore/kernels/gemm.h"

namespace moecore::nn {

float fp8_forward(Fp8Gemm& g, const Tensor& x_MK, const Tensor& w_NK, Tensor& y_MN, Tensor& wq_NK) {
  MOE_ASSERT(x_MK.cols() == w_NK.cols());
  Fp8Gemm::Quantized x = g.quantize(x_MK, Fp8Operand::Input, /*k_along_rows=*/false);
  // An FP8 parameter is its FP8 value already (copied: a Megatron FSDP unit's buffer may be reused before backward).
  wq_NK = g.weight_is_fp8_param() ? w_NK.as_dtype(DType::F32).clone() : g.quantize(w_NK, Fp8Operand::Weight, false).q;
  if (y_MN.dtype() == DType::F32) {
    kernels::gemm(x.q, false, wq_NK, true, y_MN);
  } else {  // a bf16 output: the f32 product rounded as it is stored
    Tensor y = Tensor::empty(y_MN.shape(), DType::F32, y_MN.device());
    kernels::gemm(x.q, false, wq_NK, true, y);
    y_MN.copy_from(y);
  }
  return x.scale;
}

void fp8_backward(Fp8Gemm& g, const Tensor& dy_MN, const Tensor& x_MK, float x_scale, const Tensor& wq_NK,
                  Tensor& dx_MK, float beta, Tensor& dW_NK, float grad_beta) {
  MOE_ASSERT(dy_MN.rows() == x_MK.rows() && dy_MN.cols() == wq_NK.rows());
  const bool blockwise = g.recipe() == Fp8Recipe::Blockwise;
  // Data gradient: reduction over N, dy's 1 × 128 tiles along its rows.
  Fp8Gemm::Quantized dy = g.quantize(dy_MN, Fp8Operand::Grad, false);
  if (dx_MK.dtype() == DType::F32) {
    kernels::gemm(dy.q, false, wq_NK, false, dx_MK, 1.0f, beta);
  } else {
    MOE_ASSERT(beta == 0.0f);
    Tensor dx = Tensor::empty(dx_MK.shape(), DType::F32, dx_MK.device());
    kernels::gemm(dy.q, false, wq_NK, false, dx);
    dx_MK.copy_from(dx);
  }
  // Weight gradient: reduction over M (tokens); blockwise casts both operands again with 128 × 1 tiles.
  const Tensor dyq = blockwise ? g.quantize(dy_MN, Fp8Operand::Grad, true).q : dy.q;
  const Tensor xq = g.quantize(x_MK, Fp8Operand::Input, blockwise, x_scale).q;
  kernels::gemm(dyq, true, xq, false, dW_NK, 1.0f, grad_beta);
}

}  // namespace moecore::nn
