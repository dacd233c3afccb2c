// The FlashAttention-2-style CPU kernel behind attention_forward/backward (f32, f64) and, on CPUs without native
// bf16 matmul, attention_forward_bf16/backward_bf16 (attention_flash.cpp). Internal to kernels/cpu: callers use
// attention.h.
#pragma once

#include "moecore/kernels/attention.h"

namespace moecore::kernels::flash {

// round_bf16: q (times scale), k, v, dout, the probabilities and dS are rounded to bf16 where they enter a block
// product (f32 tensors only), as attention_forward_bf16 documents; otherwise the products run in the tensors' dtype.
void forward(const Tensor& q, const Tensor& k, const Tensor& v, double scale, Tensor& o, Tensor& lse,
             const AttentionDropout* dropout, bool round_bf16);
void backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o, const Tensor& lse,
              double scale, Tensor& dq, Tensor& dk, Tensor& dv, const AttentionDropout* dropout, bool round_bf16);
// The bytes backward allocates besides its arguments (f32 tensors [S, B, Nq, D], keys and values Nkv heads): the
// memory plan's share of the kernel on the bf16 path of CPUs without native bf16 (round_bf16).
int64_t backward_bytes(int64_t S, int64_t B, int64_t Nq, int64_t Nkv, int64_t D, bool round_bf16);

// The block kernel for context parallelism (attention_flash_block.cpp) with the bf16 rounding points on f32 block
// products, whatever the CPU: what attention_block_forward/backward(round_bf16) run where the native kernel does not
// (attention.h), and the tests' reference for the native blocks.
void block_forward_rounded(const Tensor& q, const Tensor& k, const Tensor& v, int64_t q0, int64_t k0, double scale,
                           Tensor& o, Tensor& lse, const AttentionDropout* dropout = nullptr);
void block_backward_rounded(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                            const Tensor& lse, int64_t q0, int64_t k0, double scale, Tensor& dq, Tensor& dk, Tensor& dv,
                            const AttentionDropout* dropout = nullptr);

}  // namespace moecore::kernels::flash

// The CPU backend's attention entry points (attention.h's signatures), gathered into its table (AttentionKernels) by
// kernels/cpu/attention.cpp: whole sequences there and in attention_bf16.cpp, blocks in attention_flash_block.cpp.
namespace moecore::kernels::cpu {

void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, double scale, Tensor& o, Tensor& lse,
                       const AttentionDropout* dropout);
void attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                        const Tensor& lse, double scale, Tensor& dq, Tensor& dk, Tensor& dv,
                        const AttentionDropout* dropout);
void attention_forward_bf16(const Tensor& q, const Tensor& k, const Tensor& v, double scale, Tensor& o, Tensor& lse,
                            const AttentionDropout* dropout, const AttentionRope* rope, int64_t value_dim);
void attention_backward_bf16(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                             const Tensor& lse, double scale, Tensor& dq, Tensor& dk, Tensor& dv,
                             const AttentionDropout* dropout, const AttentionRope* rope, int64_t value_dim);
void attention_block_forward(const Tensor& q, const Tensor& k, const Tensor& v, int64_t q0, int64_t k0, double scale,
                             Tensor& o, Tensor& lse, const AttentionDropout* dropout, bool round_bf16);
void attention_merge(Tensor& o, Tensor& lse, const Tensor& o_part, const Tensor& lse_part);
void attention_block_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                              const Tensor& lse, int64_t q0, int64_t k0, double scale, Tensor& dq, Tensor& dk,
                              Tensor& dv, const AttentionDropout* dropout, bool round_bf16);

}  // namespace moecore::kernels::cpu
