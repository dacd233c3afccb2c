// Tensor-level CUDA cross-entropy, AdamW and SGD (see kernels.h).
#include <cmath>

#include "moecore/device/check.h"
#include "moecore/device/gpu_profile.h"
#include "moecore/device/runtime.h"
#include "moecore/device/stream.h"
#include "moecore/kernels/backends.h"
#include "moecore/kernels/cuda/kernels.h"
#include "moecore/kernels/cuda/launch.h"
#include "moecore/kernels/cuda/launch_multi_tensor.h"
#include "moecore/kernels/cuda/multi_tensor_ops.h"
#include "moecore/kernels/cuda/tensor_args.h"

namespace moecore::kernels::cuda {

using moecore::device::current_stream;

namespace {
using detail::check_launch;
using detail::f32;

}  // namespace

void cross_entropy_forward(const Tensor& logits_TV, const Tensor& targets_T, Tensor& loss_T, Tensor& lse_T) {
  const moecore::device::PhaseScope phase(moecore::device::Phase::kLoss);
  const int64_t V = logits_TV.cols();
  cross_entropy_forward_vocab_parallel(logits_TV, targets_T, 0, V, ReduceFn(), loss_T, lse_T);
}

void cross_entropy_forward_vocab_parallel(const Tensor& logits_TV, const Tensor& targets_T, int64_t vocab_start,
                                          int64_t vocab_total, const ReduceFn& all_reduce, Tensor& loss_T,
                                          Tensor& lse_T) {
  const moecore::device::PhaseScope phase(moecore::device::Phase::kLoss);
  const int64_t rows = logits_TV.rows(), V = logits_TV.cols();
  MOE_ASSERT(targets_T.numel() == rows && loss_T.numel() == rows && lse_T.numel() == rows);
  // The labels checked without a read-back: the first outside the vocabulary is recorded on the device and raised
  // when the trainer logs (kernels/id_checks.h); its loss term reads no target logit meanwhile.
  record_bad_ids(targets_T, vocab_total, 1);
  const Device dev = logits_TV.device();
  Tensor mx = Tensor::empty({rows}, DType::F32, dev), sums = Tensor::empty({2 * rows}, DType::F32, dev);
  launch::ce_row_max(f32(logits_TV, "logits"), rows, V, mx.device_data<float>(), current_stream());
  check_launch("ce_row_max");
  // The [T] statistics reduced over the vocabulary's ranks on the GPU (ProcessGroup: NCCL, or host-staged MPI where
  // ranks share a GPU).
  if (all_reduce) all_reduce(mx, true);
  launch::ce_sumexp_target(logits_TV.device_data<float>(), targets_T.raw(), detail::ids64(targets_T), rows, V,
                           vocab_start, mx.device_data<float>(), sums.device_data<float>(), current_stream());
  check_launch("ce_sumexp_target");
  if (all_reduce) all_reduce(sums, false);
  launch::ce_finish(mx.device_data<float>(), sums.device_data<float>(), rows, f32(lse_T, "lse"), f32(loss_T, "loss"),
                    current_stream());
  check_launch("ce_finish");
}

void cross_entropy_backward(const Tensor& dloss_T, const Tensor& logits_TV, const Tensor& targets_T,
                            const Tensor& lse_T, Tensor& dlogits_TV, int64_t vocab_start) {
  const moecore::device::PhaseScope phase(moecore::device::Phase::kLoss);
  const int64_t rows = logits_TV.rows(), V = logits_TV.cols();
  MOE_ASSERT(dlogits_TV.shape() == logits_TV.shape() && dloss_T.numel() == rows);
  launch::ce_backward(f32(dloss_T, "dloss"), f32(logits_TV, "logits"), targets_T.raw(), detail::ids64(targets_T),
                      f32(lse_T, "lse"), f32(dlogits_TV, "dlogits"), rows, V, vocab_start, current_stream());
  check_launch("ce_backward");
}

void cross_entropy_forward_backward(Tensor& logits_TV, const Tensor& targets_T, const Tensor& dloss_T, Tensor& loss_T,
                                    Tensor& lse_T) {
  cross_entropy_forward(logits_TV, targets_T, loss_T, lse_T);
  cross_entropy_backward(dloss_T, logits_TV, targets_T, lse_T, logits_TV, 0);
}

namespace {
launch::AdamWScalars scalars(const AdamWParams& hp, int64_t step) {
  MOE_ASSERT(step >= 1);
  const double bc1 = 1.0 - std::pow(hp.beta1, static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(hp.beta2, static_cast<double>(step));
  return launch::AdamWScalars{
      static_cast<float>(hp.lr),  static_cast<float>(hp.beta1),        static_cast<float>(hp.beta2),
      static_cast<float>(hp.eps), static_cast<float>(hp.weight_decay), static_cast<float>(bc1),
      static_cast<float>(bc2),    static_cast<float>(hp.grad_scale)};
}
}  // namespace

void adamw_step(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWParams& hp, int64_t step) {
  const moecore::device::PhaseScope phase(moecore::device::Phase::kOptimizer);
  adamw_multi_step({AdamWTensors{&param, &grad, &m, &v}}, hp, step);
}

void adamw_multi_step(const std::vector<AdamWTensors>& tensors, const AdamWParams& hp, int64_t step) {
  const moecore::device::PhaseScope phase(moecore::device::Phase::kOptimizer);
  MOE_ASSERT_MSG(!hp.clip.defined(), "the single-tensor AdamW takes its gradient scale from the host");
  const launch::AdamWScalars s = scalars(hp, step);
  launch::AdamWBatch batch;
  auto flush = [&] {
    launch::adamw(batch, s, current_stream());
    check_launch("adamw");
    batch.count = 0;
  };
  for (const AdamWTensors& t : tensors) {
    const int64_t n = t.param->numel();
    MOE_ASSERT(n == t.grad->numel() && n == t.m->numel() && n == t.v->numel());
    // Moments f32, or bf16 (the precision-aware optimizer); one launch holds one kind.
    const bool m16 = t.m->dtype() == DType::BF16, v16 = t.v->dtype() == DType::BF16;
    if (batch.count > 0 && (m16 != batch.m_bf16 || v16 != batch.v_bf16)) flush();
    batch.m_bf16 = m16;
    batch.v_bf16 = v16;
    const int i = batch.count++;
    batch.p[i] = f32(*t.param, "param");
    batch.g[i] = f32(*t.grad, "grad");
    batch.m[i] = m16 ? t.m->device_data<bf16>() : static_cast<void*>(f32(*t.m, "m"));
    batch.v[i] = v16 ? t.v->device_data<bf16>() : static_cast<void*>(f32(*t.v, "v"));
    MOE_ASSERT(!t.param_bf16 || (t.param_bf16->dtype() == DType::BF16 && t.param_bf16->numel() == n &&
                                 t.param_bf16->device() == t.param->device()));
    batch.p_bf16[i] = t.param_bf16 ? t.param_bf16->device_data<bf16>() : nullptr;
    batch.n[i] = n;
    if (batch.count == launch::kAdamTensors) flush();
  }
  if (batch.count) flush();
}

// Every tensor in multi-tensor launches (launch_multi_tensor.h), each with its own weight decay; the gradient scale
// and the skip flag from hp.clip where set (an optimizer step that never waits for the host), else hp.grad_scale.
void adamw_step_multi(std::vector<AdamWTensor>& tensors, const AdamWParams& hp, int64_t step) {
  const moecore::device::PhaseScope phase(moecore::device::Phase::kOptimizer);
  const launch::AdamWScalars s = scalars(hp, step);
  MOE_ASSERT(!hp.clip.defined() || (hp.clip.device().is_cuda() && hp.clip.dtype() == DType::F64));
  const double* clip = hp.clip.defined() ? hp.clip.device_data<double>() : nullptr;
  launch::AdamWMultiBatch batch;
  auto flush = [&] {
    launch::adamw_multi(batch, s, clip, current_stream());
    check_launch("adamw_multi");
    batch.count = 0;
  };
  for (AdamWTensor& t : tensors) {
    const int64_t n = t.param.numel();
    MOE_ASSERT(n == t.grad.numel() && n == t.m.numel() && n == t.v.numel());
    // Moments f32, or bf16 (the precision-aware optimizer); one launch holds one kind.
    const bool m16 = t.m.dtype() == DType::BF16, v16 = t.v.dtype() == DType::BF16;
    if (batch.count > 0 && (m16 != batch.m_bf16 || v16 != batch.v_bf16)) flush();
    batch.m_bf16 = m16;
    batch.v_bf16 = v16;
    const int i = batch.count++;
    batch.p[i] = f32(t.param, "param");
    batch.g[i] = f32(t.grad, "grad");
    batch.m[i] = m16 ? t.m.device_data<bf16>() : static_cast<void*>(f32(t.m, "m"));
    batch.v[i] = v16 ? t.v.device_data<bf16>() : static_cast<void*>(f32(t.v, "v"));
    MOE_ASSERT(!t.param_bf16.defined() || (t.param_bf16.dtype() == DType::BF16 && t.param_bf16.numel() == n &&
                                           t.param_bf16.device() == t.param.device()));
    batch.p_bf16[i] = t.param_bf16.defined() ? t.param_bf16.device_data<bf16>() : nullptr;
    batch.n[i] = n;
    batch.wd[i] = static_cast<float>(t.weight_decay);
    if (batch.count == launch::kMultiTensors) flush();
  }
  if (batch.count) flush();
}

void sgd_step(Tensor& param, const Tensor& grad, Tensor& buf, const SgdParams& hp) {
  const moecore::device::PhaseScope phase(moecore::device::Phase::kOptimizer);  // (sgd_step_multi reads a device scale)
  const int64_t n = param.numel();
  MOE_ASSERT(n == grad.numel() && n == buf.numel());
  launch::sgd(f32(param, "param"), f32(grad, "grad"), f32(buf, "momentum buffer"), n, static_cast<float>(hp.lr),
              static_cast<float>(hp.weight_decay), static_cast<float>(hp.momentum), static_cast<float>(hp.grad_scale),
              current_stream());
  check_launch("sgd");
}

// This backend's tables (kernels/backends.h).
const CrossEntropyKernels kCrossEntropyKernels{cross_entropy_forward, cross_entropy_forward_vocab_parallel,
                                               cross_entropy_backward, cross_entropy_forward_backward};
const OptimizerKernels kOptimizerKernels{adamw_step, adamw_step_multi, sgd_step};

}  // namespace moecore::kernels::cuda
