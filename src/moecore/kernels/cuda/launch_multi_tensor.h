// Pointer-level launchers of the multi-tensor optimizer kernels (multi_tensor.cu), Megatron's multi_tensor_apply
// style: the gradient norm's sum of squares over many tensors, the clipping factor and the non-finite check on the
// device, and AdamW / SGD over many tensors reading that factor (and the skip flag) from device memory, so an
// optimizer step queues its work and never waits for the host. Not for the single-tensor reductions (launch.h).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "moecore/kernels/cuda/launch.h"

namespace moecore::launch {

constexpr int kMultiTensors = 32;  // tensors per launch (the launch argument stays well under 4 KiB)
// Blocks per tensor in the first stage of the sum of squares: each sums the same strided subset as launch.h's
// reduce_sum (256 blocks of kThreads), and the second stage sums the 256 partials with the same tree, so each
// tensor's ‖a‖² has reduce_sum's bits.
constexpr int kSquaresBlocks = 256;

// The clip state, f64 on the device: [0] the current part's Σ, [1] the step's total Σ, [2] the norm, [3] the
// gradient scale (the clip coefficient, or 1), [4] the skip flag (1 once a norm was not finite with the check on:
// sticky until the host clears it), [5] the iteration whose norm first set it.
constexpr int kClipSlots = 6;
enum ClipSlot { kClipPart = 0, kClipTotal, kClipNorm, kClipScale, kClipSkip, kClipFirstBad };

struct SquaresBatch {
  const float* a[kMultiTensors];
  int64_t n[kMultiTensors];
  double w[kMultiTensors];  // each tensor's weight in the sum
  int count = 0;
  bool begin_part = false;  // the part's Σ starts at 0 with this batch
  bool end_part = false;    // after this batch the part's Σ is added to the total
};
// clip[kClipPart] (+)= Σ_k w_k·‖a_k‖², in the batch's order, each product and sum rounded on its own;
// partials: count·kSquaresBlocks f64 of scratch.
void squares_accumulate(const SquaresBatch& b, double* partials, double* clip, cudaStream_t s);
// clip[kClipPart] and clip[kClipTotal] set to 0 (the step's first call).
void squares_reset(double* clip, cudaStream_t s);
// The norm √Σ (Σ = clip[kClipTotal], or `world_sq` when use_world_sq: the sum over ranks, known on the host), the
// scale (clip_grad > 0: c = clip_grad / (norm + 1e-6), the scale c where c < 1, else 1), the skip flag (check_finite
// and the norm not finite), and norm_out (optional, a device f64: the norm kept for the log step).
// id_checks (optional): the deferred id checks' slots (below); an id or label found outside the vocabulary also sets
// the skip flag, so no update is applied from that step on (the host raises the id's error when it reads them).
void clip_finish(double* clip, bool use_world_sq, double world_sq, double clip_grad, bool check_finite,
                 int64_t iteration, double* norm_out, const int64_t* id_checks, cudaStream_t s);

// The embedding's token ids and the cross-entropy's labels checked against [0, V) without a read-back: per kind of
// check kIdCheckSlots int64 slots, [0] set once an id outside was seen (kept: the first one wins), [1] its position
// in the call's ids, [2] the id, [3] V, [4] the step tag the host passed (its iteration). The host reads them when
// it logs and raises the CPU kernels' error then.
constexpr int kIdCheckSlots = 5;
constexpr int kIdCheckKinds = 2;  // 0: token ids (embedding), 1: labels (cross-entropy)
void record_bad_id(const void* ids, bool ids64, int64_t n, int64_t V, int64_t* slots, int64_t tag, cudaStream_t s);

// AdamW over up to kMultiTensors tensors, each with its own weight decay; moments f32 or bf16 (every tensor of the
// batch alike); p_bf16 as AdamWBatch's. The gradient scale is clip[kClipScale] as f32 and nothing is written where
// clip[kClipSkip] is set; clip null: hp.grad_scale. hp.wd is unused. The CPU kernel's arithmetic, bitwise
// elementwise.cu's adamw.
struct AdamWMultiBatch {
  float* p[kMultiTensors];
  const float* g[kMultiTensors];
  void* m[kMultiTensors];
  void* v[kMultiTensors];
  void* p_bf16[kMultiTensors] = {};
  int64_t n[kMultiTensors];
  float wd[kMultiTensors];
  int count = 0;
  bool m_bf16 = false, v_bf16 = false;
};
void adamw_multi(const AdamWMultiBatch& b, const AdamWScalars& hp, const double* clip, cudaStream_t s);

// SGD with momentum (launch.h's sgd) over up to kMultiTensors tensors (m: the momentum buffer), the gradient scale
// and skip flag as adamw_multi's; p_bf16 (optional) receives the updated parameter rounded to bf16.
void sgd_multi(const AdamWMultiBatch& b, float lr, float momentum, const double* clip, float grad_scale,
               cudaStream_t s);

}  // namespace moecore::launch
