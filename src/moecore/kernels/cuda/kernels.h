// The CUDA kernels at the Tensor level, with the API's signatures (kernels/*.h document each op) and a few of the GPU's
// own: the GPU's backend tables (kernels/backends.h) hold these, and kernels/dispatch.cpp calls them for tensors on
// a GPU, so nn/ and moe/ run unchanged. Element types: f32 everywhere (as the CPU kernels
// compute); GEMMs through cuBLASLt (handle, descriptors, algorithm and workspace cached per shape; gemm_batched in one
// strided-batched call) with f32 or bf16 operands accumulating in f32 and an f32 output; the bf16 attention takes f32
// tensors and rounds the GEMM operands inside, like the CPU one, and takes no RoPE (only the CPU's FlashNative kernel
// applies it); attention dropout inside the kernels and hidden dropout on f32 rows (dropout.cu) draw the CPU's
// keep bits, micro-batches of up to launch_dropout.h's kDropoutMaxSamples sequences. Where the GPU has no fused kernel
// for a form the API offers, the wrapper composes it from the kernels it has: the norms run one kernel for f32 rows, a
// bf16 output is the f32 result cast, and the residual add of the _add forms and dres are add_ calls before and after
// the kernel (the CPU's values, not fused); the fused cross-entropy is the forward, then the backward writing over the
// logits; the vocab-parallel cross-entropy all-reduces host copies of its [T] statistics (host-staged MPI);
// adamw_step_multi runs every tensor in multi-tensor launches (multi_tensor.cu), each with its own weight decay,
// writing param_bf16 where given, the gradient scale from hp.clip's device memory where set; the
// segment biases launch once per segment with rows (the experts' rows, known on the host), y f32 and dy f32 or bf16.
// Compiled only in a build with CUDA.
#pragma once

#include <vector>

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

namespace moecore::kernels::cuda {

// The ops both backends implement (each backend's tables, kernels/backends.h, list them).
MOECORE_BACKEND_OPS

// TF32 for f32 GEMMs (off unless set).
void set_allow_tf32(bool on);
bool allow_tf32();

// Every tensor of the lists in as few launches as possible (kernels/cuda/launch.h kAdamTensors per launch).
struct AdamWTensors {
  Tensor* param;
  const Tensor* grad;
  Tensor* m;
  Tensor* v;
  Tensor* param_bf16 = nullptr;  // optional: receives the updated parameter rounded to bf16
};
void adamw_multi_step(const std::vector<AdamWTensors>& tensors, const AdamWParams& hp, int64_t step);

}  // namespace moecore::kernels::cuda
