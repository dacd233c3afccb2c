// SGD with momentum as Megatron builds it (torch.optim.SGD(lr, weight_decay, momentum); no dampening, no
// Nesterov), one tensor per call:
//   d = grad_scale·g + wd·p   (L2 weight decay added to the gradient; grad_scale is clipping's coefficient)
//   buf ← momentum·buf + d;  p ← p − lr·buf
// torch's first step sets buf = d, the same as a zero buffer. Every product and sum is rounded on its own (no fused
// multiply-add) on either device, so the CPU and the GPU give the same bits. Not the optimizer's bookkeeping
// (optim/sgd.h).
#pragma once

#include <vector>

#include "moecore/core/tensor.h"
#include "moecore/kernels/adamw_update.h"

namespace moecore::kernels {

struct SgdParams {
  double lr = 1e-3;
  double weight_decay = 0.0;
  double momentum = 0.9;
  double grad_scale = 1.0;
};

// param and buf updated in place, grad read; one floating dtype (f32 on the GPU).
void sgd_step(Tensor& param, const Tensor& grad, Tensor& buf, const SgdParams& hp);

// The optimizer updates, adamw_update.h's and this header's, as one backend implements them
// (kernels/cpu/sgd_update.cpp, kernels/cuda/kernels_loss_optim.cpp), each with the signature of the op it is named
// after; kernels/dispatch.cpp picks the table of the (first) parameter's device.
struct OptimizerKernels {
  void (*adamw_step)(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWParams& hp, int64_t step);
  void (*adamw_step_multi)(std::vector<AdamWTensor>& tensors, const AdamWParams& hp, int64_t step);
  void (*sgd_step)(Tensor& param, const Tensor& grad, Tensor& buf, const SgdParams& hp);
};

}  // namespace moecore::kernels
