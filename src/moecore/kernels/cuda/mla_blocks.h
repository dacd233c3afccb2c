// Multi-latent attention's channel-block moves on the GPU at the Tensor level (kernels/mla_blocks.h; the dispatch
// code calls this for GPU tensors; a CPU-only build answers it in kernels/cuda/mla_blocks_unavailable.cpp).
#pragma once

#include "moecore/core/tensor.h"

namespace moecore::kernels::cuda {

// f32 or f64, both tensors on one GPU: strided copies (copy_2d) and, for the head sum, one kernel.
void mla_move_block(const Tensor& src, int64_t Ns, int64_t Ws, int64_t s0, Tensor& dst, int64_t Nd, int64_t Wd,
                    int64_t d0, int64_t w, int64_t rows);

}  // namespace moecore::kernels::cuda
