// The CPU kernels at the Tensor level, with the API's signatures (kernels/*.h, which documents each): the CPU's
// backend tables (kernels/backends.h) hold these, and kernels/dispatch.cpp calls them for tensors in host memory. Ops
// that have only a CPU kernel keep their API names and are defined in kernels/cpu directly; they refuse a tensor that
// is not in host memory (require_cpu). Attention: f32 (and f64) through the flash kernel; bf16 GEMM operands through
// the kernel bf16_attention_kernel() picks on this CPU.
#pragma once

#include <string_view>
#include <vector>

#include "moecore/core/error.h"
#include "moecore/core/tensor.h"
#include "moecore/kernels/activation.h"
#include "moecore/kernels/adamw_update.h"
#include "moecore/kernels/attention.h"
#include "moecore/kernels/backend_ops.h"
#include "moecore/kernels/cross_entropy.h"
#include "moecore/kernels/dropout.h"
#include "moecore/kernels/elementwise.h"
#include "moecore/kernels/grouped_gemm.h"
#include "moecore/kernels/layernorm.h"
#include "moecore/kernels/mla_blocks.h"
#include "moecore/kernels/position_rows.h"
#include "moecore/kernels/rmsnorm.h"
#include "moecore/kernels/rope.h"
#include "moecore/kernels/sgd_update.h"
#include "moecore/kernels/shared_gate.h"

namespace moecore::kernels::cpu {

// A CPU-only op's refusal of a tensor outside host memory, naming the op.
inline void require_cpu(const Tensor& t, std::string_view op) {
  MOE_CHECK(t.device().is_cpu(), "{} runs on the CPU only, but its tensor is on {}; run with --device cpu", op,
            t.device().str());
}

// The ops both backends implement (each backend's tables, kernels/backends.h, list them).
MOECORE_BACKEND_OPS

}  // namespace moecore::kernels::cpu
