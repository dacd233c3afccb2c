// Pointer-level launchers of the tensor-core attention kernels (attention_tc.cu, attention_tc_bwd.cu) and of the
// warp-per-row kernels they stand beside (attention.cu). launch.h's attention_forward / attention_backward choose
// between them: the tensor-core kernels for the bf16 path when attention_tc_supported says so and the pointers are
// 16-byte aligned, the warp-per-row kernels otherwise (and for f32). Layouts as in launch.h: q/o/dout/dq
// [S, B, Nq, D], k/v/dk/dv [S, B, Nkv, D], lse/delta [B, Nq, S], all f32 in memory. Every kernel also takes an
// AttentionSpan: the blocks of context parallelism (kernels/attention.h attention_block_*), queries and keys at
// global offsets.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "moecore/kernels/cuda/launch_dropout.h"

namespace moecore::launch {

// Where one call's rows sit: Sq query rows (q/o/dout/dq [Sq, B, Nq, D], lse/delta [B, Nq, Sq]) and Sk keys (k/v/dk/dv
// [Sk, B, Nkv, D]); key j is visible to row i when j ≤ i + off (off = q0 − k0 of the global positions), so a row
// with i + off < 0 sees no key (o 0, lse −inf). accumulate_dq: the backward adds its dQ term to dq (the CPU block
// backward's contract) instead of writing it. The whole causal sequence is {S, S, 0}.
struct AttentionSpan {
  int64_t Sq = 0, Sk = 0, off = 0;
  int accumulate_dq = 0;
};
inline AttentionSpan causal_span(int64_t S) {
  return AttentionSpan{S, S, 0, 0};
}

// The tensor-core path covers round_bf16 with D ∈ {64, 128} and S ≤ 65535·64 (one grid row per 64-row tile).
bool attention_tc_supported(int64_t S, int64_t B, int64_t Nq, int64_t D, bool round_bf16);

// bf16 operands (q̂ = bf16(scale·q), k̂, v̂, P; dÔ and dS in the backward), f32 accumulation; lse in natural units.
// drop: attention dropout (launch.h), P ⊙ Z rounded to bf16 as the CPU bf16 kernels round it.
void attention_tc_forward(const float* q, const float* k, const float* v, float* o, float* lse, int64_t S, int64_t B,
                          int64_t Nq, int64_t Nkv, int64_t D, float scale, const DropoutParams& drop, cudaStream_t s);
void attention_tc_forward(const float* q, const float* k, const float* v, float* o, float* lse, const AttentionSpan& sp,
                          int64_t B, int64_t Nq, int64_t Nkv, int64_t D, float scale, const DropoutParams& drop,
                          cudaStream_t s);
// delta = rowsum(dout ⊙ o) must already be in place (attention_delta). dK/dV and dQ are written, not accumulated.
// dkv_part: attention_tc_dkv_part_floats(...) floats of scratch (null when that is 0).
void attention_tc_backward(const float* dout, const float* q, const float* k, const float* v, const float* lse,
                           const float* delta, float* dq, float* dk, float* dv, float* dkv_part, int64_t S, int64_t B,
                           int64_t Nq, int64_t Nkv, int64_t D, float scale, const DropoutParams& drop, cudaStream_t s);
// dkv_part: attention_tc_dkv_part_floats(sp.Sk, ...) floats.
void attention_tc_backward(const float* dout, const float* q, const float* k, const float* v, const float* lse,
                           const float* delta, float* dq, float* dk, float* dv, float* dkv_part,
                           const AttentionSpan& sp, int64_t B, int64_t Nq, int64_t Nkv, int64_t D, float scale,
                           const DropoutParams& drop, cudaStream_t s);

// How many blocks share one key tile's dK/dV by splitting the group's query heads: doubled (dividing the group)
// until the dK/dV grid has 2048 blocks. With one sequence under GQA (B 1, 32/4 heads, S 4096: 4 kv heads × 64 key
// tiles = 256 blocks) a block per key tile would walk all 8 heads of its group: the longest block (the first key
// tile) then does 8 × 128 query steps against an average over the SMs' slots of ~130. A function of the shape only,
// so the summation order, and the bits, do not depend on the GPU.
inline int64_t attention_tc_dkv_splits(int64_t S, int64_t B, int64_t Nq, int64_t Nkv) {
  const int64_t group = Nq / Nkv, blocks = B * Nkv * ((S + 63) / 64);
  int64_t splits = 1;
  while (blocks * splits < 2048 && group % (2 * splits) == 0) splits *= 2;
  return splits;
}
// S: the keys (a span's Sk). The partial dK and dV of the splits ([2, splits, S, B, Nkv, D] f32), 0 without a split.
inline int64_t attention_tc_dkv_part_floats(int64_t S, int64_t B, int64_t Nq, int64_t Nkv, int64_t D) {
  const int64_t splits = attention_tc_dkv_splits(S, B, Nq, Nkv);
  return splits > 1 ? 2 * splits * S * B * Nkv * D : 0;
}

// delta[b, h, i] = Σ_d dout·o (f32, one warp per row).
void attention_delta(const float* dout, const float* o, float* delta, int64_t S, int64_t B, int64_t Nq, int64_t D,
                     cudaStream_t s);

// The warp-per-row kernels (f32 or bf16-rounded, D ≤ 256): the fallback, and the reference the tests compare with.
void attention_rowwise_forward(const float* q, const float* k, const float* v, float* o, float* lse, int64_t S,
                               int64_t B, int64_t Nq, int64_t Nkv, int64_t D, float scale, bool round_bf16,
                               const DropoutParams& drop, cudaStream_t s);
void attention_rowwise_backward(const float* dout, const float* q, const float* k, const float* v, const float* o,
                                const float* lse, float* dq, float* dk, float* dv, float* delta_scratch, int64_t S,
                                int64_t B, int64_t Nq, int64_t Nkv, int64_t D, float scale, bool round_bf16,
                                const DropoutParams& drop, cudaStream_t s);
void attention_rowwise_forward(const float* q, const float* k, const float* v, float* o, float* lse,
                               const AttentionSpan& sp, int64_t B, int64_t Nq, int64_t Nkv, int64_t D, float scale,
                               bool round_bf16, const DropoutParams& drop, cudaStream_t s);
void attention_rowwise_backward(const float* dout, const float* q, const float* k, const float* v, const float* o,
                                const float* lse, float* dq, float* dk, float* dv, float* delta_scratch,
                                const AttentionSpan& sp, int64_t B, int64_t Nq, int64_t Nkv, int64_t D, float scale,
                                bool round_bf16, const DropoutParams& drop, cudaStream_t s);

// launch.h's attention_forward / attention_backward over a span (the tensor-core kernels where the bf16 path allows
// them, else the warp-per-row ones): the GPU form of kernels/attention.h's attention_block_forward/backward.
void attention_span_forward(const float* q, const float* k, const float* v, float* o, float* lse,
                            const AttentionSpan& sp, int64_t B, int64_t Nq, int64_t Nkv, int64_t D, float scale,
                            bool round_bf16, const DropoutParams& drop, cudaStream_t s);
// dkv_scratch: attention_tc_dkv_part_floats(sp.Sk, ...) floats where the tensor-core path applies (null when 0).
void attention_span_backward(const float* dout, const float* q, const float* k, const float* v, const float* o,
                             const float* lse, float* dq, float* dk, float* dv, float* delta_scratch,
                             float* dkv_scratch, const AttentionSpan& sp, int64_t B, int64_t Nq, int64_t Nkv, int64_t D,
                             float scale, bool round_bf16, const DropoutParams& drop, cudaStream_t s);

// (o, lse) ← the softmax-weighted merge with (o_part, lse_part), partial results of the same rows over disjoint keys
// (kernels/attention.h attention_merge, the CPU's f32 formula): o/o_part [S, BN, D], lse/lse_part [BN, S]. A part
// with lse −inf leaves the row; a row with lse −inf takes the part. Element-parallel, no atomics: the same bits on
// every run.
void attention_merge(float* o, float* lse, const float* o_part, const float* lse_part, int64_t S, int64_t BN, int64_t D,
                     cudaStream_t s);

}  // namespace moecore::launch
