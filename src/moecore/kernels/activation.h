// FFN activations with an optional per-row scale p (the router probability Megatron applies inside the expert
// activation): y = act(x) ⊙ p. SwiGLU takes fc1's [T, 2F] output as gate ‖ linear halves.
#pragma once

#include <string_view>

#include "moecore/core/tensor.h"

namespace moecore::kernels {

enum class Activation { SwiGLU, GeLU, SquaredReLU };

Activation parse_activation(std::string_view name);  // "swiglu", "gelu", "squared-relu"
std::string_view activation_name(Activation a);
inline bool is_gated(Activation a) {
  return a == Activation::SwiGLU;
}

// x_TF2 [T, 2F] (gated) or x_TF [T, F] -> y_TF [T, F]. probs_T: nullptr or [T] of the computation's dtype (x's, f32
// for a bf16 x: a bf16 GEMM's output, widened as it is read). y_TF may be bf16 for an f32 computation: the result
// is rounded as it is stored, ready for a bf16 GEMM.
void activation_forward(Activation act, const Tensor& x, const Tensor* probs_T, Tensor& y_TF);
// dy_TF (the computation's dtype, or bf16 where x and dx are: a bf16 GEMM's output, widened as it is read) -> dx
// (written, shape of x; bf16 allowed for an f32 computation, like y above); dprobs_T (written) when probs_T is given.
void activation_backward(Activation act, const Tensor& dy_TF, const Tensor& x, const Tensor* probs_T, Tensor& dx,
                         Tensor* dprobs_T);

// The entry points above as one backend implements them (kernels/cpu/activation.cpp, kernels/cuda/kernels.cpp);
// kernels/dispatch.cpp picks the table of the input's device.
struct ActivationKernels {
  void (*forward)(Activation act, const Tensor& x, const Tensor* probs_T, Tensor& y_TF);
  void (*backward)(Activation act, const Tensor& dy_TF, const Tensor& x, const Tensor* probs_T, Tensor& dx,
                   Tensor* dprobs_T);
};

}  // namespace moecore::kernels
