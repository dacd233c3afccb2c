// Grouped expert GEMMs on the GPU (grouped_gemm.cpp; the op is kernels/grouped_gemm.h's, declared in kernels.h) and
// the choice of their implementation. One GEMM per expert over that expert's block of rows, every expert a different
// row count, experts with no rows skipped. Operands f32 (TF32 off unless set_allow_tf32) or bf16 with f32
// accumulation; outputs f32, or bf16 rounded by the GEMM's epilogue (the CPU grouped experts' semantics under
// --bf16); weight gradients accumulate into f32. Two implementations, selected at run time: cuBLAS's
// cublasGemmGroupedBatchedEx, one launch per GEMM (the default), where cuBLAS offers the types, and one cuBLASLt
// matmul per expert spread over 4 streams (the loop: for the rest, and selectable for comparison). No bias epilogue:
// the experts' biases are added per expert segment of rows afterwards (kernels::segment_bias_forward). Plain host
// declarations: a CPU-only build defines these in kernels/cuda/moe_kernels_unavailable.cpp.
#pragma once

#include <vector>

#include "moecore/kernels/cuda/kernels.h"

namespace moecore::kernels::cuda {

enum class GroupedGemmImpl { kGrouped, kLoop };
// The implementation every grouped GEMM uses from now on. Until set: MOECORE_GROUPED_GEMM=grouped (or =loop) from the
// environment, else kGrouped. For tests and benchmarks: the results agree within rounding, and each is bitwise
// reproducible on its own.
void set_grouped_gemm_impl(GroupedGemmImpl impl);
GroupedGemmImpl grouped_gemm_impl();
inline const char* grouped_gemm_impl_name(GroupedGemmImpl impl) {
  return impl == GroupedGemmImpl::kGrouped ? "grouped (cublasGemmGroupedBatchedEx)" : "loop (cuBLASLt per expert)";
}
// How the grouped GEMMs ran since the process started: as one grouped launch, as the per-expert loop (chosen, or
// types the grouped call does not offer: bf16 operands into an f32 output), and of those loops how many after
// cuBLAS refused a grouped call it was expected to take. For the benchmark's report and the tests.
struct GroupedGemmCalls {
  int64_t grouped = 0, loop = 0, refused = 0;
};
GroupedGemmCalls grouped_gemm_calls();

}  // namespace moecore::kernels::cuda
