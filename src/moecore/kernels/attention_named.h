// The CPU's attention kernels by name, for `moecore bench attention`, which times each one (training lets
// bf16_attention_kernel() pick: attention.h). Each runs attention.h's contract (whole causal sequences, or with
// block_q0 >= 0 a context-parallel block of queries at block_q0.. against keys at 0..) with the bf16 rounding points
// of attention_forward_bf16: OneDnn its batched matmuls (whole sequences only), Flash f32 block products of rounded
// operands, FlashNative native bf16 block products (this CPU's fastest, has_native_bf16_attention). Host tensors.
#pragma once

#include <string>

#include "moecore/kernels/attention.h"

namespace moecore::kernels {

bool has_native_bf16_attention();
std::string native_bf16_attention_name();  // the native block products' backend ("amx", ...)

void attention_forward_named(Bf16AttentionKernel kind, const Tensor& q, const Tensor& k, const Tensor& v,
                             int64_t block_q0, double scale, Tensor& o, Tensor& lse, const AttentionDropout* dropout,
                             const AttentionRope* rope);
void attention_backward_named(Bf16AttentionKernel kind, const Tensor& dout, const Tensor& q, const Tensor& k,
                              const Tensor& v, const Tensor& o, const Tensor& lse, int64_t block_q0, double scale,
                              Tensor& dq, Tensor& dk, Tensor& dv, const AttentionDropout* dropout,
                              const AttentionRope* rope);

}  // namespace moecore::kernels
