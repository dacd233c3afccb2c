// Pointer-level launchers of the tensor-core attention kernels (attention_tc.cu, attention_tc_bwd.cu) and of the
// warp-per-row kernels they stand beside (attention.cu). launch.h's attention_forward / attention_backward choose
// between them: the tensor-core kernels for the bf16 path when attention_tc_supported says so and the pointers are
// 16-byte aligned, the warp-per-row kernels otherwise (and for f32). Layouts as in launch.h: q/o/dout/dq
// [S, B, Nq, D], k/v/dk/dv [S, B, Nkv, D], lse/delta [B, Nq, S], all f32 in memory.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace moecore::launch {

// The tensor-core path covers round_bf16 with D ∈ {64, 128} and S ≤ 65535·64 (one grid row per 64-row tile).
bool attention_tc_supported(int64_t S, int64_t B, int64_t Nq, int64_t D, bool round_bf16);

// bf16 operands (q̂ = bf16(scale·q), k̂, v̂, P; dÔ and dS in the backward), f32 accumulation; lse in natural units.
void attention_tc_forward(const float* q, const float* k, const float* v, float* o, float* lse, int64_t S, int64_t B,
                          int64_t Nq, int64_t Nkv, int64_t D, float scale, cudaStream_t s);
// delta = rowsum(dout ⊙ o) must already be in place (attention_delta). dK/dV and dQ are written, not accumulated.
void attention_tc_backward(const float* dout, const float* q, const float* k, const float* v, const float* lse,
                           const float* delta, float* dq, float* dk, float* dv, int64_t S, int64_t B, int64_t Nq,
                           int64_t Nkv, int64_t D, float scale, cudaStream_t s);

// delta[b, h, i] = Σ_d dout·o (f32, one warp per row).
void attention_delta(const float* dout, const float* o, float* delta, int64_t S, int64_t B, int64_t Nq, int64_t D,
                     cudaStream_t s);

// The warp-per-row kernels (f32 or bf16-rounded, D ≤ 256): the fallback, and the reference the tests compare with.
void attention_rowwise_forward(const float* q, const float* k, const float* v, float* o, float* lse, int64_t S,
                               int64_t B, int64_t Nq, int64_t Nkv, int64_t D, float scale, bool round_bf16,
                               cudaStream_t s);
void attention_rowwise_backward(const float* dout, const float* q, const float* k, const float* v, const float* o,
                                const float* lse, float* dq, float* dk, float* dv, float* delta_scratch, int64_t S,
                                int64_t B, int64_t Nq, int64_t Nkv, int64_t D, float scale, bool round_bf16,
                                cudaStream_t s);

}  // namespace moecore::launch
