// The kernel backends' tables of ops, one per op family and device (the family's header, kernels/*.h, defines the
// table's type): the CPU's always, the GPU's in a build with CUDA. Only kernels/dispatch.cpp reads them, choosing by
// where an op's tensors live; a build without CUDA declares no GPU table, and dispatch.cpp answers a GPU tensor there
// (which no correct caller has) with the build's message, for every op at once. The gradient clip's and the id
// checks' tables are the GPU's alone (the CPU runs those ops in kernels/grad_clip.cpp and the kernels themselves).
#pragma once

#include "moecore/kernels/activation.h"
#include "moecore/kernels/attention.h"
#include "moecore/kernels/cross_entropy.h"
#include "moecore/kernels/dropout.h"
#include "moecore/kernels/elementwise.h"
#include "moecore/kernels/embedding.h"
#include "moecore/kernels/grad_clip.h"
#include "moecore/kernels/grouped_gemm.h"
#include "moecore/kernels/id_checks.h"
#include "moecore/kernels/layernorm.h"
#include "moecore/kernels/mla_blocks.h"
#include "moecore/kernels/moe_permute.h"
#include "moecore/kernels/position_rows.h"
#include "moecore/kernels/rope.h"
#include "moecore/kernels/routing.h"
#include "moecore/kernels/sgd_update.h"
#include "moecore/kernels/shared_gate.h"

namespace moecore::kernels {

namespace cpu {
extern const RouterKernels kRouterKernels;              // kernels/cpu/routing.cpp
extern const AttentionKernels kAttentionKernels;        // kernels/cpu/attention.cpp
extern const GemmKernels kGemmKernels;                  // kernels/cpu/grouped_gemm.cpp
extern const ElementwiseKernels kElementwiseKernels;    // kernels/cpu/elementwise.cpp
extern const NormKernels kNormKernels;                  // kernels/cpu/layernorm.cpp
extern const RopeKernels kRopeKernels;                  // kernels/cpu/rope.cpp
extern const ActivationKernels kActivationKernels;      // kernels/cpu/activation.cpp
extern const EmbeddingKernels kEmbeddingKernels;        // kernels/cpu/embedding.cpp
extern const CrossEntropyKernels kCrossEntropyKernels;  // kernels/cpu/cross_entropy.cpp
extern const OptimizerKernels kOptimizerKernels;        // kernels/cpu/sgd_update.cpp
extern const DropoutKernels kDropoutKernels;            // kernels/cpu/dropout.cpp
extern const PositionRowsKernels kPositionRowsKernels;  // kernels/cpu/position_rows.cpp
extern const MlaBlockKernels kMlaBlockKernels;          // kernels/cpu/mla_blocks.cpp
extern const SharedGateKernels kSharedGateKernels;      // kernels/cpu/shared_gate.cpp
extern const MoePermuteKernels kMoePermuteKernels;      // kernels/cpu/moe_permute.cpp
}  // namespace cpu

namespace cuda {
extern const RouterKernels kRouterKernels;              // kernels/cuda/routing.cpp
extern const AttentionKernels kAttentionKernels;        // kernels/cuda/attention.cpp
extern const GemmKernels kGemmKernels;                  // kernels/cuda/grouped_gemm.cpp
extern const ElementwiseKernels kElementwiseKernels;    // kernels/cuda/kernels.cpp
extern const NormKernels kNormKernels;                  // kernels/cuda/kernels.cpp
extern const RopeKernels kRopeKernels;                  // kernels/cuda/kernels.cpp
extern const ActivationKernels kActivationKernels;      // kernels/cuda/kernels.cpp
extern const EmbeddingKernels kEmbeddingKernels;        // kernels/cuda/kernels.cpp
extern const CrossEntropyKernels kCrossEntropyKernels;  // kernels/cuda/kernels_loss_optim.cpp
extern const OptimizerKernels kOptimizerKernels;        // kernels/cuda/kernels_loss_optim.cpp
extern const DropoutKernels kDropoutKernels;            // kernels/cuda/dropout.cpp
extern const PositionRowsKernels kPositionRowsKernels;  // kernels/cuda/position_rows.cpp
extern const MlaBlockKernels kMlaBlockKernels;          // kernels/cuda/mla_blocks.cpp
extern const SharedGateKernels kSharedGateKernels;      // kernels/cuda/shared_gate.cpp
extern const MoePermuteKernels kMoePermuteKernels;      // kernels/cuda/moe_permute_ops.cpp
extern const ClipKernels kClipKernels;                  // kernels/cuda/multi_tensor_ops.cpp
extern const IdCheckKernels kIdCheckKernels;            // kernels/cuda/multi_tensor_ops.cpp
}  // namespace cuda

}  // namespace moecore::kernels
