// Pointer-level launchers of the shared-expert gate (moe/shared_experts.h): g = σ(z) per token, y = m ⊙ g, and the
// backward dm = dy ⊙ g, dz = (Σ_h dy·m)·g·(1 − g). f32, [T, H] rows; one block per row for the row sum (fixed tree).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace moecore::launch {

// gate_T holds the logits z on entry and σ(z) on return.
void shared_gate_forward(float* gate_T, const float* m_TH, float* y_TH, int64_t T, int64_t H, cudaStream_t s);
void shared_gate_backward(const float* dy_TH, const float* gate_T, const float* m_TH, float* dm_TH, float* dz_T,
                          int64_t T, int64_t H, cudaStream_t s);

}  // namespace moecore::launch
