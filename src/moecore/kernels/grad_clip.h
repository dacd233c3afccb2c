// The gradient norm of an optimizer step, its clipping coefficient and the non-finite check, computed where the
// gradients live: on a GPU in device memory by multi-tensor kernels (kernels/cuda/multi_tensor.cu), so the step
// queues its work without waiting for the host, which reads the norms only when it logs them; on the CPU on the
// host, as sum_squares always has. And the multi-tensor SGD update. Not the reduction of gradients across ranks
// (optim/grad_sync.h) nor the choice of what to clip (optim/chained_optimizer.h).
#pragma once

#include <optional>
#include <span>
#include <vector>

#include "moecore/core/tensor.h"
#include "moecore/kernels/adamw_update.h"

namespace moecore::kernels {

// f64 slots on the gradients' device: the current part's Σ, the step's total Σ, the norm, the gradient scale (the
// clip coefficient, or 1), the skip flag (set once a norm is not finite with the check on, and it stays set: every
// later update is skipped too, so the model stays as it was before that step), the first iteration that set it;
// then a ring of the norms of the steps not yet read.
struct ClipState {
  static constexpr int64_t kPart = 0, kTotal = 1, kNorm = 2, kScale = 3, kSkip = 4, kFirstBad = 5, kRing = 6;
  Tensor slots;         // [kRing + ring capacity] f64
  Tensor partials;      // GPU scratch of the sum of squares
  int64_t pending = 0;  // norms in the ring not yet read
  int64_t capacity() const { return slots.numel() - kRing; }
  Device device() const { return slots.device(); }
};
ClipState make_clip_state(Device d, int64_t ring_capacity);

// The step's Σ set to 0.
void squares_reset(ClipState& s);
// One part (a parameter class): part = Σ_i w_i·‖t_i‖² in the order given (t_i f32 or f64; each ‖t_i‖² as
// sum_squares computes it on its device), then total += part. On the CPU exactly the host loop
// `part += w·sum_squares(t)`.
void squares_add_part(ClipState& s, std::span<const Tensor> ts, std::span<const double> w);
// The step's Σ on the host (a read-back on a GPU: multi-rank runs sum it over the ranks there).
double squares_total(const ClipState& s);
// norm = √Σ (Σ: the total, or `world_sq` where given), scale = clip_grad / (norm + 1e-6) where clip_grad > 0 and
// that is below 1, else 1; with check_finite a norm that is not finite sets the skip flag (naming `iteration`).
// With `defer` the norm also goes to the ring (the host reads it with take_deferred_norms; a full ring is a
// caller's error).
void clip_finish(ClipState& s, std::optional<double> world_sq, double clip_grad, bool check_finite, int64_t iteration,
                 bool defer);
// The norm clip_finish computed when it is on the host already (the CPU), else nullopt (a GPU: it stays there).
std::optional<double> norm_on_host(const ClipState& s);

// The norms written since the last call, in order, and the first iteration whose norm was not finite with the check
// on (0: none). One read of the slots on a GPU.
struct DeferredNorms {
  std::vector<double> norms;
  int64_t first_nonfinite = 0;
};
DeferredNorms take_deferred_norms(ClipState& s);

// Hands the clip state to an update: on a GPU hp.clip (the kernels read the scale and the skip flag from device
// memory); on the CPU, or with `host` (an update on host copies, Muon), hp.grad_scale from the slots, read back.
// Returns false where the step is skipped and the caller can know it without a GPU read (on the CPU, or `host`).
bool apply_clip(const ClipState& s, AdamWParams& hp, bool host = false);

// SGD with momentum (kernels/sgd_update.h) over many tensors (m: the momentum buffer; param_bf16, where given, receives
// the updated parameter rounded to bf16), each with its own weight decay; on a GPU in multi-tensor launches
// reading hp.clip where set.
void sgd_step_multi(std::vector<AdamWTensor>& tensors, const AdamWParams& hp, double momentum);

// The GPU's side of the entry points above (kernels/cuda/multi_tensor_ops.cpp; the CPU's runs in
// kernels/grad_clip.cpp itself), which kernels/dispatch.cpp gives for gradients on a GPU. finish takes world_sq as
// a flag and a value.
struct ClipKernels {
  void (*state_init)(ClipState& s);
  void (*squares_reset)(ClipState& s);
  void (*squares_add_part)(ClipState& s, std::span<const Tensor> ts, std::span<const double> w);
  void (*finish)(ClipState& s, bool use_world_sq, double world_sq, double clip_grad, bool check_finite,
                 int64_t iteration, bool defer);
  void (*sgd_step_multi)(std::vector<AdamWTensor>& tensors, const AdamWParams& hp, double momentum);
};

}  // namespace moecore::kernels
