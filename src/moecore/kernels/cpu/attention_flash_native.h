// The flash attention kernel with native bf16 block products (attention_flash_native.cpp): the kernel
// attention_forward_bf16/backward_bf16 run where bf16_attention_kernel() is FlashNative. Internal to kernels/cpu:
// callers use attention.h.
#pragma once

#include "moecore/kernels/attention.h"
#include "moecore/kernels/cpu/attention_blocks_bf16.h"

namespace moecore::kernels::flash {

// Whether this CPU runs a native backend (Amx or Avx512Bf16).
bool has_native_bf16();
// backward_native's temporaries, in bytes (the allocator's size classes): Δ, the packed bf16 copies of q, dout, k and
// v, and the f32 dQ accumulator. What the memory plan adds to the backward's working set where training picks it.
int64_t backward_native_bytes(int64_t S, int64_t B, int64_t Nq, int64_t Nkv, int64_t D);
// The backend training runs: the fastest this CPU has (Amx, else Avx512Bf16), or the one MOECORE_NATIVE_BF16
// (auto, amx, avx512bf16) names; a name this CPU cannot run is an error.
NativeBf16 best_native_bf16();

// The rounding points of flash::forward/backward(round_bf16 = true): scale·q, k, v, dout, the probabilities and dS
// rounded to bf16 where they enter a product; scores, softmax statistics and lse f32. Tensors are f32 or bf16 each
// (lse f32): inputs read as they are, outputs rounded once when bf16. `rope`: RoPE applied to q and k as they are
// packed, and transposed on dq and dk as they are written (attention.h AttentionRope). `backend` must be supported
// (native_bf16_supported).
void forward_native(const Tensor& q, const Tensor& k, const Tensor& v, double scale, Tensor& o, Tensor& lse,
                    const AttentionDropout* dropout, NativeBf16 backend, const AttentionRope* rope = nullptr);
void backward_native(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                     const Tensor& lse, double scale, Tensor& dq, Tensor& dk, Tensor& dv,
                     const AttentionDropout* dropout, NativeBf16 backend, const AttentionRope* rope = nullptr);

// Blocks at global positions for context parallelism (attention_flash_native_block.cpp): attention.h's
// attention_block_forward/backward contract with round_bf16 (f32 tensors; the rounding points above), on native bf16
// block products. `dropout` as attention_block_* hands it on (its offsets already those of the block).
void block_forward_native(const Tensor& q, const Tensor& k, const Tensor& v, int64_t q0, int64_t k0, double scale,
                          Tensor& o, Tensor& lse, const AttentionDropout* dropout, NativeBf16 backend);
void block_backward_native(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                           const Tensor& lse, int64_t q0, int64_t k0, double scale, Tensor& dq, Tensor& dk, Tensor& dv,
                           const AttentionDropout* dropout, NativeBf16 backend);

}  // namespace moecore::kernels::flash
