// The CPU backend of the MoE permutation's ops (kernels/moe_permute.h, where each op is specified): any float dtype,
// f32 rows rounded to bf16 as they are gathered, the experts' padded layout (row_align) and padding to capacity.
// The CPU's permutation table (kernels/backends.h) holds these; kernels/moe_permute.cpp calls them for CPU tensors
// (and builds a GPU's padded plan with the CPU's moe_permute_plan).
#pragma once

#include "moecore/kernels/moe_permute.h"

namespace moecore::kernels::cpu {

void moe_permute_plan(const Tensor& idx_TK, int64_t E, int64_t pad_capacity, int64_t block, int64_t row_align,
                      PermutePlan& plan);
void moe_gather_rows(const Tensor& src, const Tensor& idx_R, Tensor& dst);
void moe_scatter_rows(const Tensor& src, const Tensor& idx_R, Tensor& dst);
void moe_sum_rows_per_token(const Tensor& src_RH, const Tensor& token_offsets_T1, const Tensor& token_rows,
                            Tensor& dst_TH);
void moe_gather_probs(const Tensor& probs_TK, const Tensor& row_tk_R, Tensor& probs_R);
void moe_scatter_probs(const Tensor& dprobs_R, const Tensor& row_tk_R, Tensor& dprobs_TK);

}  // namespace moecore::kernels::cpu
