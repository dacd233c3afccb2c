// The Tensor-level CUDA backend of kernels/grad_clip.h (the gradient norm, clip coefficient and non-finite check in
// device memory), of the multi-tensor SGD and of the deferred id checks: the GPU's clip and id-check tables
// (kernels/backends.h) hold these. Compiled only in a build with CUDA.
#pragma once

#include <span>
#include <vector>

#include "moecore/kernels/grad_clip.h"
#include "moecore/kernels/id_checks.h"

namespace moecore::kernels::cuda {

void clip_state_init(ClipState& s);
void squares_reset(ClipState& s);
void squares_add_part(ClipState& s, std::span<const Tensor> ts, std::span<const double> w);
void clip_finish(ClipState& s, bool use_world_sq, double world_sq, double clip_grad, bool check_finite,
                 int64_t iteration, bool defer);
void sgd_step_multi(std::vector<AdamWTensor>& tensors, const AdamWParams& hp, double momentum);

// The deferred id checks (kernels/id_checks.h): ids_T's first id outside [0, V) recorded in device memory (kind 0:
// token ids, 1: labels), tagged with the iteration set_id_check_iteration gave.
void record_bad_ids(const Tensor& ids_T, int64_t V, int kind);
void set_id_check_iteration(int64_t iteration);
// The first recorded bad id of the current device (kind 0 before 1), its record cleared; none recorded: kind -1.
BadId take_bad_id();

}  // namespace moecore::kernels::cuda
