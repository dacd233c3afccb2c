// Grouped expert GEMMs on the GPU (grouped_gemm.cpp; the API in kernels/grouped_gemm.h): one GEMM per expert over that
// expert's block of rows, every expert a different row count, experts with no rows skipped. Operands f32 (TF32 off
// unless set_allow_tf32) or bf16 with f32 accumulation and an f32 output: the CPU grouped experts' semantics. Two
// implementations, selected at run time: one cuBLASLt matmul per expert spread over 4 streams (the default, the faster:
// docs/performance.md), or cuBLAS's cublasGemmGroupedBatchedEx, one call per GEMM kind. No bias epilogue: the experts'
// biases are added per expert segment of rows afterwards (kernels::segment_bias_forward). Plain host declarations: a
// CPU-only build defines these in kernels/cuda/moe_kernels_unavailable.cpp.
#pragma once

#include <vector>

#include "moecore/core/tensor.h"

namespace moecore::kernels::cuda {

enum class GroupedGemmImpl { kCublasGrouped, kLtStreams };
// The implementation every grouped GEMM uses from now on. Until set: MOECORE_GROUPED_GEMM=cublas (or =lt) from the
// environment, else kLtStreams.
void set_grouped_gemm_impl(GroupedGemmImpl impl);
GroupedGemmImpl grouped_gemm_impl();
inline const char* grouped_gemm_impl_name(GroupedGemmImpl impl) {
  return impl == GroupedGemmImpl::kCublasGrouped ? "cublasGemmGroupedBatchedEx" : "cuBLASLt per expert, 4 streams";
}
// True once cublasGemmGroupedBatchedEx refused an operand type (cuBLAS lists bf16 inputs with a bf16 output only):
// those calls then ran as one cublasGemmEx per expert on the current stream. For the benchmark's report.
bool grouped_gemm_fell_back();

// For every expert e with rows[e] > 0, rows [row_begin[e], row_begin[e] + rows[e]) of A and C:
//   C_e = A_e · W_eᵀ (trans_w: W [E, N, K]) or C_e = A_e · W_e (W [E, K, N]).
// A [R, K] and W one dtype (f32 or bf16), C f32 [R, N]; rows of C outside every expert's block are not written.
void grouped_gemm(const Tensor& A_RK, const Tensor& W, bool trans_w, Tensor& C_RN,
                  const std::vector<int64_t>& row_begin, const std::vector<int64_t>& rows);
// dW_e += dY_eᵀ · X_e for every expert with rows (dW f32 [E, N, K]; dY [R, N] and X [R, K] one dtype).
void grouped_gemm_wgrad(const Tensor& dY_RN, const Tensor& X_RK, Tensor& dW_ENK, const std::vector<int64_t>& row_begin,
                        const std::vector<int64_t>& rows);

}  // namespace moecore::kernels::cuda
