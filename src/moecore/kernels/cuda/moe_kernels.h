// The MoE token permutation on the GPU at the Tensor level (moe_permute_ops.cpp over moe_permute.cu): the CUDA
// backend of kernels/moe_permute.h, held by the GPU's permutation table (kernels/backends.h), which
// kernels/moe_permute.cpp calls for CUDA tensors. Plain host declarations (no CUDA headers), compiled only in a build
// with CUDA.
#pragma once

#include <vector>

#include "moecore/core/tensor.h"
#include "moecore/kernels/moe_permute.h"

namespace moecore::kernels::cuda {

// The dispatch plan of the router's ids idx_TK (I32 [T, K], GPU) over experts [0, E) (other ids, −1 included, have no
// row): rows expert-major, ascending token inside an expert (a stable CUB radix sort on the expert id with value
// t·K + j). Writes tokens_per_expert [E] (host), row_token_R (I32), row_tk_R (I64), token_offsets_T1 (I64 [T + 1]) and
// token_rows (I32 [R]; each token's rows in ascending expert order), all on idx_TK's GPU.
// Host synchronisation: one, the copy of the [E] counts to the host (they size every tensor after them and the
// grouped GEMM's per-expert problems, as Megatron's tokens_per_expert .cpu() does).
void moe_build_plan(const Tensor& idx_TK, int64_t E, std::vector<int64_t>& tokens_per_expert, Tensor& row_token_R,
                    Tensor& row_tk_R, Tensor& token_offsets_T1, Tensor& token_rows);
// moe_permute_plan for idx_TK on a GPU: moe_build_plan's plan (no padding to capacity, row_align 1). The row ops
// (moe_permute.h): f32 rows (gathered rows may be bf16 from f32), I32 row indices, the CPU's bits.
MOECORE_MOE_PERMUTE_OPS

}  // namespace moecore::kernels::cuda
