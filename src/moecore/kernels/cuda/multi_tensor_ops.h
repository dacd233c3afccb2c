// The Tensor-level CUDA backend of kernels/grad_clip.h (the gradient norm, clip coefficient and non-finite check in
// device memory) and of the multi-tensor SGD; kernels/grad_clip.cpp routes GPU tensors here. A CPU-only build
// defines these in multi_tensor_ops_unavailable.cpp.
#pragma once

#include <span>
#include <vector>

#include "moecore/kernels/grad_clip.h"

namespace moecore::kernels::cuda {

void clip_state_init(ClipState& s);
void squares_reset(ClipState& s);
void squares_add_part(ClipState& s, std::span<const Tensor> ts, std::span<const double> w);
void clip_finish(ClipState& s, bool use_world_sq, double world_sq, double clip_grad, bool check_finite,
                 int64_t iteration, bool defer);
void sgd_step_multi(std::vector<AdamWTensor>& tensors, const AdamWParams& hp, double momentum);

}  // namespace moecore::kernels::cuda
