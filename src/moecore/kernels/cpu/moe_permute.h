// The CPU backend of the MoE permutation's ops (kernels/moe_permute.h, where each op is specified): any float dtype,
// f32 rows rounded to bf16 as they are gathered, the experts' padded layout (row_align) and padding to capacity.
// kernels/moe_permute.cpp calls these for CPU tensors (and builds a GPU's padded plan with moe_permute_plan).
#pragma once

#include "moecore/kernels/moe_permute.h"

namespace moecore::kernels::cpu {

void moe_permute_plan(const Tensor& idx_TK, int64_t E, int64_t pad_capacity, int64_t block, int64_t row_align,
                      PermutePlan& plan);
#include "moecore/kernels/moe_permute_backend.inc"

}  // namespace moecore::kernels::cpu
