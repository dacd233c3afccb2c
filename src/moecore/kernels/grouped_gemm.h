// Grouped expert GEMMs: one product per expert over that expert's block of expert-major rows, each expert with its
// own row count, experts without rows skipped. The GPU grouped experts (moe/grouped_experts_cuda.cpp) run their four
// products per layer through these; the CPU grouped experts keep their padded rows and packed weights
// (moe/grouped_experts.cpp), and the CPU backend here is the reference the GPU's is tested against.
#pragma once

#include <cstdint>
#include <vector>

#include "moecore/core/tensor.h"

namespace moecore::kernels {

// For every expert e with rows[e] > 0, rows [row_begin[e], row_begin[e] + rows[e]) of A and C:
//   C_e = A_e · W_eᵀ (trans_w: W [E, N, K]) or C_e = A_e · W_e (W [E, K, N]).
// A [R, K] and W one dtype (f32 or bf16; f32 accumulation), C [R, N] f32, or bf16 with bf16 operands (the f32
// accumulation rounded to nearest even as it is written); rows of C outside every expert's block are not written.
void grouped_gemm(const Tensor& A_RK, const Tensor& W, bool trans_w, Tensor& C_RN,
                  const std::vector<int64_t>& row_begin, const std::vector<int64_t>& rows);
// dW_e += dY_eᵀ · X_e for every expert with rows (dW f32 [E, N, K]; dY [R, N] and X [R, K] one dtype).
void grouped_gemm_wgrad(const Tensor& dY_RN, const Tensor& X_RK, Tensor& dW_ENK, const std::vector<int64_t>& row_begin,
                        const std::vector<int64_t>& rows);

}  // namespace moecore::kernels
