// The Tensor-level CUDA gradient norm, clip state and multi-tensor SGD (see multi_tensor_ops.h): batches of up to
// launch_multi_tensor.h's kMultiTensors tensors per launch, every launch on the current stream, nothing read back.
#include "moecore/kernels/cuda/multi_tensor_ops.h"

#include "moecore/device/gpu_profile.h"
#include "moecore/device/stream.h"
#include "moecore/kernels/cuda/launch_multi_tensor.h"
#include "moecore/kernels/cuda/tensor_args.h"

namespace moecore::kernels::cuda {

using moecore::cuda::current_stream;

namespace {
double* clip_slots(const Tensor& slots) {
  MOE_ASSERT(slots.device().is_cuda() && slots.dtype() == DType::F64 && slots.numel() >= ClipState::kRing);
  return slots.device_data<double>();
}
}  // namespace

void clip_state_init(ClipState& s) {
  static_assert(ClipState::kRing == launch::kClipSlots && ClipState::kSkip == launch::kClipSkip &&
                ClipState::kScale == launch::kClipScale && ClipState::kFirstBad == launch::kClipFirstBad);
  s.partials = Tensor::empty({int64_t{launch::kMultiTensors} * launch::kSquaresBlocks}, DType::F64, s.device());
}

void squares_reset(ClipState& s) {
  const moecore::cuda::PhaseScope phase(moecore::cuda::Phase::kOptimizer);
  launch::squares_reset(clip_slots(s.slots), current_stream());
  detail::check_launch("squares_reset");
}

void squares_add_part(ClipState& s, std::span<const Tensor> ts, std::span<const double> w) {
  const moecore::cuda::PhaseScope phase(moecore::cuda::Phase::kOptimizer);
  MOE_ASSERT(ts.size() == w.size());
  if (ts.empty()) return;  // an empty part adds nothing
  launch::SquaresBatch b;
  b.begin_part = true;
  for (size_t i = 0; i < ts.size(); i++) {
    b.a[b.count] = detail::f32(ts[i], "gradient");
    b.n[b.count] = ts[i].numel();
    b.w[b.count++] = w[i];
    if (b.count == launch::kMultiTensors && i + 1 < ts.size()) {
      launch::squares_accumulate(b, s.partials.device_data<double>(), clip_slots(s.slots), current_stream());
      detail::check_launch("squares_accumulate");
      b = launch::SquaresBatch();
    }
  }
  b.end_part = true;
  launch::squares_accumulate(b, s.partials.device_data<double>(), clip_slots(s.slots), current_stream());
  detail::check_launch("squares_accumulate");
}

void clip_finish(ClipState& s, bool use_world_sq, double world_sq, double clip_grad, bool check_finite,
                 int64_t iteration, bool defer) {
  const moecore::cuda::PhaseScope phase(moecore::cuda::Phase::kOptimizer);
  double* slots = clip_slots(s.slots);
  launch::clip_finish(slots, use_world_sq, world_sq, clip_grad, check_finite, iteration,
                      defer ? slots + ClipState::kRing + s.pending : nullptr, current_stream());
  detail::check_launch("clip_finish");
}

void sgd_step_multi(std::vector<AdamWTensor>& tensors, const AdamWParams& hp, double momentum) {
  const moecore::cuda::PhaseScope phase(moecore::cuda::Phase::kOptimizer);
  const double* clip = hp.clip.defined() ? clip_slots(hp.clip) : nullptr;
  launch::AdamWMultiBatch b;
  auto flush = [&] {
    launch::sgd_multi(b, static_cast<float>(hp.lr), static_cast<float>(momentum), clip,
                      static_cast<float>(hp.grad_scale), current_stream());
    detail::check_launch("sgd_multi");
    b.count = 0;
  };
  for (AdamWTensor& t : tensors) {
    const int64_t n = t.param.numel();
    MOE_ASSERT(n == t.grad.numel() && n == t.m.numel());
    MOE_ASSERT(!t.param_bf16.defined() || (t.param_bf16.dtype() == DType::BF16 && t.param_bf16.numel() == n &&
                                           t.param_bf16.device() == t.param.device()));
    const int i = b.count++;
    b.p[i] = detail::f32(t.param, "param");
    b.g[i] = detail::f32(t.grad, "grad");
    b.m[i] = detail::f32(t.m, "momentum buffer");
    b.v[i] = nullptr;
    b.p_bf16[i] = t.param_bf16.defined() ? t.param_bf16.device_data<bf16>() : nullptr;
    b.n[i] = n;
    b.wd[i] = static_cast<float>(t.weight_decay);
    if (b.count == launch::kMultiTensors) flush();
  }
  if (b.count) flush();
}

}  // namespace moecore::kernels::cuda
