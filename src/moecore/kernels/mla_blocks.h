// Multi-latent attention's channel-block moves between head layouts (nn/mla_attention.cpp): the heads' q, k and v
// assembled from the up projections' outputs for the attention kernel, and their gradients taken apart again.
#pragma once

#include "moecore/core/tensor.h"

namespace moecore::kernels {

// Between the [rows, Ns, Ws] view of src and the [rows, Nd, Wd] view of dst: channels [s0, s0 + w) of source head n
// go to [d0, d0 + w) of destination head n (Ns == Nd), of every destination head (Ns == 1: broadcast), or the source
// heads are summed in ascending order into the one destination head (Nd == 1 < Ns). Destination channels outside
// the block are left alone. f32 or f64, both tensors on one device.
void mla_move_block(const Tensor& src, int64_t Ns, int64_t Ws, int64_t s0, Tensor& dst, int64_t Nd, int64_t Wd,
                    int64_t d0, int64_t w, int64_t rows);

// mla_move_block as one backend implements it (kernels/cpu/mla_blocks.cpp, kernels/cuda/mla_blocks.cpp);
// kernels/dispatch.cpp picks the table of the source's device.
struct MlaBlockKernels {
  void (*move_block)(const Tensor& src, int64_t Ns, int64_t Ws, int64_t s0, Tensor& dst, int64_t Nd, int64_t Wd,
                     int64_t d0, int64_t w, int64_t rows);
};

}  // namespace moecore::kernels
