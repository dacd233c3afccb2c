// Pointer-level launcher of multi-latent attention's head sum (nn/mla_attention.cpp move_block with Nd == 1 < Ns):
// dst[r·Wd + d0 + i] = Σ_n src[r·Ns·Ws + n·Ws + s0 + i] for i < w, r < R, with n ascending from 0 (the CPU loop's
// order, so the same bits). The block moves without a sum are strided copies (device::copy_2d).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace moecore::launch {

void mla_head_sum_f32(const float* src, int64_t Ns, int64_t Ws, int64_t s0, float* dst, int64_t Wd, int64_t d0,
                      int64_t w, int64_t R, cudaStream_t s);
void mla_head_sum_f64(const double* src, int64_t Ns, int64_t Ws, int64_t s0, double* dst, int64_t Wd, int64_t d0,
                      int64_t w, int64_t R, cudaStream_t s);

}  // namespace moecore::launch
