// Pointer-level launchers of the learned position embedding (nn/position_embedding.h): h[s, b, :] += P[s, :] and
// dP[s, :] += Σ_b dh[s, b, :] with b ascending (the CPU loop's order, so the same bits). f32.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace moecore::launch {

void position_add_rows(float* h_SBH, const float* table_SH, int64_t S, int64_t B, int64_t H, cudaStream_t s);
void position_sum_rows(const float* dh_SBH, float* grad_SH, int64_t S, int64_t B, int64_t H, cudaStream_t s);

}  // namespace moecore::launch
