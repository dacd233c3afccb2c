// The Tensor-level CUDA gradient norm, clip state and multi-tensor SGD (see multi_tensor_ops.h): batches of up to
// launch_multi_tensor.h's kMultiTensors tensors per launch, every launch on the current stream, nothing read back.
#include "moecore/kernels/cuda/multi_tensor_ops.h"

#include "moecore/device/gpu_profile.h"
#include "moecore/device/stream.h"
#include "moecore/kernels/backends.h"
#include "moecore/kernels/cuda/kernels.h"
#include "moecore/kernels/cuda/launch_multi_tensor.h"
#include "moecore/kernels/cuda/tensor_args.h"

namespace moecore::kernels::cuda {

using moecore::device::current_stream;

namespace {
// The deferred id checks' record (launch_multi_tensor.h's record_bad_id slots), allocated on the device at its
// first use; one per process (the current device's: one GPU per rank).
Tensor& id_check_record() {
  static Tensor* record = new Tensor();  // never destroyed: it may outlive the device allocator at exit
  return *record;
}
int64_t g_id_check_iteration = 0;

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
  const moecore::device::PhaseScope phase(moecore::device::Phase::kOptimizer);
  launch::squares_reset(clip_slots(s.slots), current_stream());
  detail::check_launch("squares_reset");
}

void squares_add_part(ClipState& s, std::span<const Tensor> ts, std::span<const double> w) {
  const moecore::device::PhaseScope phase(moecore::device::Phase::kOptimizer);
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
  const moecore::device::PhaseScope phase(moecore::device::Phase::kOptimizer);
  double* slots = clip_slots(s.slots);
  const Tensor& ids = id_check_record();
  const int64_t* id_checks = ids.defined() && ids.device() == s.device() ? ids.device_data<int64_t>() : nullptr;
  launch::clip_finish(slots, use_world_sq, world_sq, clip_grad, check_finite, iteration,
                      defer ? slots + ClipState::kRing + s.pending : nullptr, id_checks, current_stream());
  detail::check_launch("clip_finish");
}

void sgd_step_multi(std::vector<AdamWTensor>& tensors, const AdamWParams& hp, double momentum) {
  const moecore::device::PhaseScope phase(moecore::device::Phase::kOptimizer);
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

void set_id_check_iteration(int64_t iteration) {
  g_id_check_iteration = iteration;
}

void record_bad_ids(const Tensor& ids_T, int64_t V, int kind) {
  MOE_ASSERT(kind >= 0 && kind < launch::kIdCheckKinds);
  Tensor& record = id_check_record();
  if (!record.defined() || record.device() != ids_T.device())
    record = Tensor::zeros({int64_t{launch::kIdCheckKinds} * launch::kIdCheckSlots}, DType::I64, ids_T.device());
  launch::record_bad_id(ids_T.raw(), detail::ids64(ids_T), ids_T.numel(), V,
                        record.device_data<int64_t>() + kind * launch::kIdCheckSlots, g_id_check_iteration,
                        current_stream());
  detail::check_launch("record_bad_id");
}

BadId take_bad_id() {
  Tensor& record = id_check_record();
  if (!record.defined()) return {-1, 0, 0, 0, 0};
  const Tensor h = record.to(Device::cpu());  // the one read-back
  for (int k = 0; k < launch::kIdCheckKinds; k++) {
    const int64_t* r = h.data<int64_t>() + k * launch::kIdCheckSlots;
    if (r[0] == 0) continue;
    record.zero_();
    return {k, r[1], r[2], r[3], r[4]};
  }
  return {-1, 0, 0, 0, 0};
}

// This backend's tables (kernels/backends.h).
const ClipKernels kClipKernels{clip_state_init, squares_reset, squares_add_part, clip_finish, sgd_step_multi};
const IdCheckKernels kIdCheckKernels{set_id_check_iteration, take_bad_id};

}  // namespace moecore::kernels::cuda
