// Grouped expert GEMMs on the GPU (grouped_gemm.cpp; the op is kernels/grouped_gemm.h's, declared in kernels.h) and
// the choice of their implementation. One GEMM per expert over that expert's block of rows, every expert a different
// row count, experts with no rows skipped. Operands f32 (TF32 off unless set_allow_tf32) or bf16 with f32
// accumulation and an f32 output: the CPU grouped experts' semantics. Two implementations, selected at run time: one
// cuBLASLt matmul per expert spread over 4 streams (the default, the faster: docs/performance.md), or cuBLAS's
// cublasGemmGroupedBatchedEx, one call per GEMM kind. No bias epilogue: the experts' biases are added per expert
// segment of rows afterwards (kernels::segment_bias_forward). Plain host declarations: a CPU-only build defines these
// in kernels/cuda/moe_kernels_unavailable.cpp.
#pragma once

#include <vector>

#include "moecore/kernels/cuda/kernels.h"

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

}  // namespace moecore::kernels::cuda
