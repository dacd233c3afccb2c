// The MoE permutation and grouped expert GEMM entry points (kernels/cuda/moe_kernels.h, kernels.h) in a
// CPU-only build: no CUDA tensor can exist here, so they are never reached by a correct caller; they throw if one is.
#include "moecore/device/runtime.h"
#include "moecore/kernels/cuda/kernels.h"
#include "moecore/kernels/cuda/moe_kernels.h"

namespace moecore::kernels::cuda {

using moecore::device::no_cuda_kernel;

void moe_build_plan(const Tensor&, int64_t, std::vector<int64_t>&, Tensor&, Tensor&, Tensor&, Tensor&) {
  no_cuda_kernel("moe_build_plan");
}
void moe_gather_rows(const Tensor&, const Tensor&, Tensor&) {
  no_cuda_kernel("moe_gather_rows");
}
void moe_scatter_rows(const Tensor&, const Tensor&, Tensor&) {
  no_cuda_kernel("moe_scatter_rows");
}
void moe_sum_rows_per_token(const Tensor&, const Tensor&, const Tensor&, Tensor&) {
  no_cuda_kernel("moe_sum_rows_per_token");
}
void moe_gather_probs(const Tensor&, const Tensor&, Tensor&) {
  no_cuda_kernel("moe_gather_probs");
}
void moe_scatter_probs(const Tensor&, const Tensor&, Tensor&) {
  no_cuda_kernel("moe_scatter_probs");
}

void grouped_gemm(const Tensor&, const Tensor&, bool, Tensor&, const std::vector<int64_t>&, const std::vector<int64_t>&,
                  const ExpertWeightPacker*) {
  no_cuda_kernel("grouped_gemm");
}
void grouped_gemm_wgrad(const Tensor&, const Tensor&, Tensor&, const std::vector<int64_t>&, const std::vector<int64_t>&,
                        float) {
  no_cuda_kernel("grouped_gemm_wgrad");
}
int64_t grouped_gemm_row_align() {
  return 1;
}

}  // namespace moecore::kernels::cuda
