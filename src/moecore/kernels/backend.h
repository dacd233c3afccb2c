// What each kernel backend offers beyond the ops' common contract, for the modules whose tensors' dtypes or layout
// follow it: asked by device and answered in one place (kernels/dispatch.cpp), so that no module asks which device
// it is on. Not the ops themselves (kernels/*.h).
#pragma once

#include <cstdint>

#include "moecore/core/device.h"

namespace moecore::kernels {

struct BackendOffers {
  // GEMMs with bf16 operands and no bias write a bf16 C, rounded by the GEMM (the CPU's oneDNN epilogue); elsewhere
  // the dense layers' outputs are f32.
  bool gemm_bf16_output = false;
  // The attention kernel takes bf16 q, k, v and RoPE itself and writes a bf16 o (the CPU's FlashNative kernel,
  // attention_bf16_tensors in nn/self_attention.h says for which sequences).
  bool attention_bf16_tensors = false;
  // cross_entropy_forward_backward computes the loss and the logits' gradient in one pass; elsewhere the forward and
  // the backward kernels run where the model's forward and backward are.
  bool fused_loss_backward = false;
  // Every weight-gradient writer takes a beta, so a gradient can be left stale at zero_grad and overwritten by its
  // first writer (nn::ParamRegistry::zero_grad's lazy mode).
  bool lazy_grad_zero = false;
  // The optimizer's element-wise update writes the parameter's bf16 copy beside its f32 value.
  bool update_writes_bf16_copy = false;
  // grad-clip's norm is computed where the host reads it (clip_finish); elsewhere it stays on the device.
  bool norm_on_host = false;
};

const BackendOffers& backend_offers(Device d);

}  // namespace moecore::kernels
