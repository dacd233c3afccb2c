// The GPU's bf16 attention through cuDNN's fused scaled-dot-product attention (attention_cudnn.cpp): the route
// attention_ops.cpp takes for attention_forward_bf16 / attention_backward_bf16 where kernels/attention_backend.h says
// cuDNN covers the call. Same contract as the native kernels: q, k, v, dout, o, dq, dk, dv f32 in moecore's [S, B, N,
// D] rows (rounded to bf16 for cuDNN and its bf16 results widened back), lse [B, Nq, S] f32 in natural units of the
// scaled scores, dq/dk/dv written. The backward may follow a native forward and the reverse: o and lse mean the same.
#pragma once

#include <cstdint>

#include "moecore/core/tensor.h"
#include "moecore/kernels/attention.h"

namespace moecore::kernels::cuda {

// True when cuDNN ran the call; false when the caller runs the native kernels: the backend is native, the call is
// not covered (dropout, ...), cuDNN is not available or refuses the shape. Each reason is printed once. Dv: the
// value heads' width (≤ D; v's and o's channels past Dv are zero padding, MLA's): D for plain attention.
bool cudnn_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, int64_t Dv, double scale, Tensor& o,
                             Tensor& lse, const AttentionDropout* dropout);
bool cudnn_attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                              const Tensor& lse, int64_t Dv, double scale, Tensor& dq, Tensor& dk, Tensor& dv,
                              const AttentionDropout* dropout);

// Calls cuDNN ran since the process started (tests and benchmarks check the path they asked for ran).
struct CudnnAttentionCounts {
  int64_t forward = 0, backward = 0;
};
CudnnAttentionCounts cudnn_attention_counts();

}  // namespace moecore::kernels::cuda
