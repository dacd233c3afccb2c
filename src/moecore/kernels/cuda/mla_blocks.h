// Multi-latent attention's channel-block moves on the GPU at the Tensor level (nn/mla_attention.cpp calls this for
// GPU tensors; a CPU-only build answers it in kernels/cuda/mla_blocks_unavailable.cpp).
#pragma once

#include "moecore/core/tensor.h"

namespace moecore::kernels::cuda {

// Between the [rows, Ns, Ws] view of src and the [rows, Nd, Wd] view of dst: channels [s0, s0 + w) of source head n
// go to [d0, d0 + w) of destination head n (Ns == Nd), of every destination head (Ns == 1: broadcast), or the source
// heads are summed in ascending order into the one destination head (Nd == 1 < Ns). Other channels are left alone.
// f32 or f64, both tensors on the same GPU; strided copies (copy_2d) and, for the sum, one kernel.
void mla_move_block(const Tensor& src, int64_t Ns, int64_t Ws, int64_t s0, Tensor& dst, int64_t Nd, int64_t Wd,
                    int64_t d0, int64_t w, int64_t rows);

}  // namespace moecore::kernels::cuda
