// The gradient norm and clip state on either device (see grad_clip.h): the CPU's host loop here, the GPU's
// multi-tensor kernels in kernels/cuda/multi_tensor_ops.cpp (the clip table dispatch.cpp gives).
#include "moecore/kernels/grad_clip.h"

#include <cmath>

#include "moecore/kernels/dispatch.h"
#include "moecore/kernels/elementwise.h"
#include "moecore/kernels/sgd_update.h"

namespace moecore::kernels {

ClipState make_clip_state(Device d, int64_t ring_capacity) {
  MOE_ASSERT(ring_capacity >= 1);
  ClipState s;
  s.slots = Tensor::zeros({ClipState::kRing + ring_capacity}, DType::F64, d);
  if (d.is_cuda()) clip_on_gpu().state_init(s);
  return s;
}

void squares_reset(ClipState& s) {
  if (s.device().is_cuda()) return clip_on_gpu().squares_reset(s);
  s.slots.set_item(ClipState::kPart, 0.0);
  s.slots.set_item(ClipState::kTotal, 0.0);
}

void squares_add_part(ClipState& s, std::span<const Tensor> ts, std::span<const double> w) {
  MOE_ASSERT(ts.size() == w.size());
  if (s.device().is_cuda()) return clip_on_gpu().squares_add_part(s, ts, w);
  double part = 0;
  for (size_t i = 0; i < ts.size(); i++) part += w[i] * sum_squares(ts[i]);
  s.slots.set_item(ClipState::kPart, part);
  s.slots.set_item(ClipState::kTotal, s.slots.item(ClipState::kTotal) + part);
}

double squares_total(const ClipState& s) {
  return s.slots.item(ClipState::kTotal);  // a read-back on a GPU
}

void clip_finish(ClipState& s, std::optional<double> world_sq, double clip_grad, bool check_finite, int64_t iteration,
                 bool defer) {
  MOE_ASSERT_MSG(!defer || s.pending < s.capacity(), "the clip state holds {} unread norms: read them first",
                 s.pending);
  if (s.device().is_cuda()) {
    clip_on_gpu().finish(s, world_sq.has_value(), world_sq.value_or(0.0), clip_grad, check_finite, iteration, defer);
  } else {  // the GPU kernel's formula, operation for operation
    const double norm = std::sqrt(world_sq ? *world_sq : s.slots.item(ClipState::kTotal));
    double scale = 1.0;
    if (clip_grad > 0) {
      const double coeff = clip_grad / (norm + 1e-6);
      if (coeff < 1.0) scale = coeff;
    }
    s.slots.set_item(ClipState::kNorm, norm);
    s.slots.set_item(ClipState::kScale, scale);
    if (check_finite && !std::isfinite(norm) && s.slots.item(ClipState::kSkip) == 0.0) {
      s.slots.set_item(ClipState::kSkip, 1.0);
      s.slots.set_item(ClipState::kFirstBad, static_cast<double>(iteration));
    }
    if (defer) s.slots.set_item(ClipState::kRing + s.pending, norm);
  }
  if (defer) s.pending++;
}

std::optional<double> norm_on_host(const ClipState& s) {
  if (s.device().is_cuda()) return std::nullopt;
  return s.slots.item(ClipState::kNorm);
}

DeferredNorms take_deferred_norms(ClipState& s) {
  DeferredNorms d;
  const Tensor h = s.slots.slice(0, ClipState::kRing + s.pending).to(Device::cpu());  // one read on a GPU
  for (int64_t i = 0; i < s.pending; i++) d.norms.push_back(h.item(ClipState::kRing + i));
  if (h.item(ClipState::kSkip) != 0.0) d.first_nonfinite = static_cast<int64_t>(h.item(ClipState::kFirstBad));
  s.pending = 0;
  return d;
}

bool apply_clip(const ClipState& s, AdamWParams& hp, bool host) {
  if (s.device().is_cuda() && !host) {
    hp.clip = s.slots;
    return true;
  }
  const Tensor h = s.slots.slice(0, ClipState::kRing).to(Device::cpu());  // free on the CPU
  hp.clip = Tensor();
  hp.grad_scale = h.item(ClipState::kScale);
  return h.item(ClipState::kSkip) == 0.0;
}

void sgd_step_multi(std::vector<AdamWTensor>& tensors, const AdamWParams& hp, double momentum) {
  if (!tensors.empty() && tensors.front().param.device().is_cuda())
    return clip_on_gpu().sgd_step_multi(tensors, hp, momentum);
  MOE_ASSERT_MSG(!hp.clip.defined(), "the CPU's SGD takes its gradient scale from the host");
  for (auto& x : tensors) {
    sgd_step(x.param, x.grad, x.m, SgdParams{hp.lr, x.weight_decay, momentum, hp.grad_scale});
    if (x.param_bf16.defined()) x.param_bf16.copy_from(x.param);  // a master's bf16 parameter, rounded
  }
}

}  // namespace moecore::kernels
