// The CPU backend of the MoE permutation's ops (kernels/moe_permute.h, where each op is specified): any float dtype,
// f32 rows rounded to bf16 as they are gathered, the experts' padded layout (row_align) and padding to capacity.
// The CPU's permutation table (kernels/backends.h) holds these; kernels/moe_permute.cpp calls them for CPU tensors
// (and builds a GPU's padded plan with the CPU's moe_permute_plan).
#pragma once

#include "moecore/kernels/moe_permute.h"

namespace moecore::kernels::cpu {

MOECORE_MOE_PERMUTE_OPS

}  // namespace moecore::kernels::cpu
