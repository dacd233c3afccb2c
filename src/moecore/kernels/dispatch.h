// The backend tables (kernels/backends.h) for tensors on a device, chosen in kernels/dispatch.cpp: the CPU's, or the
// GPU's where the build has one; a GPU tensor in a build without CUDA (which no correct caller has) gets the build's
// message there, for every op at once. Read by the API's entry points inside kernels/ (dispatch*.cpp,
// moe_permute.cpp, grad_clip.cpp, id_checks.cpp), not by modules.
#pragma once

#include "moecore/kernels/backends.h"

namespace moecore::kernels {

const RouterKernels& router_on(Device d);
const AttentionKernels& attention_on(Device d);
const GemmKernels& gemm_on(Device d);
const ElementwiseKernels& elementwise_on(Device d);
const NormKernels& norms_on(Device d);
const RopeKernels& rope_on(Device d);
const ActivationKernels& activation_on(Device d);
const EmbeddingKernels& embedding_on(Device d);
const CrossEntropyKernels& cross_entropy_on(Device d);
const OptimizerKernels& optimizer_on(Device d);
const DropoutKernels& dropout_on(Device d);
const PositionRowsKernels& position_rows_on(Device d);
const MlaBlockKernels& mla_blocks_on(Device d);
const SharedGateKernels& shared_gate_on(Device d);
const MoePermuteKernels& moe_permute_on(Device d);
// The GPU's alone: the clip's kernels (the build's message without CUDA) and the id checks' record (null without
// CUDA: nothing was recorded).
const ClipKernels& clip_on_gpu();
const IdCheckKernels* id_checks_on_gpu();

}  // namespace moecore::kernels
