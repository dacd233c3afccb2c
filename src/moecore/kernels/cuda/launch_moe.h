// Pointer-level launchers of the MoE token permutation (moe_permute.cu): the dispatch plan built on the GPU from the
// router's [T, K] ids with CUB, row gathers and scatters, the per-token ordered row sum, and the probability moves.
// Like launch.h, nvcc parses nothing of moecore but this. Callers: kernels/cuda/moe_permute_ops.cpp. Every launcher
// queues work on `s` and returns; nothing here synchronises with the host.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace moecore::launch {

// Scratch bytes moe_sort_assignments needs for n = T·K assignments over E experts (CUB's radix sort temp storage).
size_t moe_sort_scratch_bytes(int64_t n, int64_t E);
// Stable radix sort of the assignments i = t·K + j by expert: keys are idx[i] for ids in [0, E), E otherwise
// (dropped −1 and other ranks' experts sort last). Writes sorted_i [n] (assignment index, ascending inside an
// expert, so ascending token) and counts_E [E] (rows per expert, from the sorted keys by binary search: no atomics).
// keys_in, keys_out, vals_in: scratch of n elements each.
void moe_sort_assignments(const int32_t* idx, int64_t n, int64_t E, uint32_t* keys_in, uint32_t* keys_out,
                          int32_t* vals_in, int32_t* sorted_i, int64_t* counts_E, void* scratch, size_t scratch_bytes,
                          cudaStream_t s);
// The first R sorted assignments become rows: row_token[r] = i / K, row_tk[r] = i, row_of_i[i] = r; row_of_i [n]
// is −1 for the assignments without a row (dropped, or another rank's expert).
void moe_build_rows(const int32_t* sorted_i, int64_t n, int64_t R, int64_t K, int32_t* row_token, int64_t* row_tk,
                    int32_t* row_of_i, cudaStream_t s);
constexpr int kMoeMaxTopK = 64;  // rows sorted in registers up to this top-k, in memory above
// Scratch bytes moe_token_csr needs for T tokens.
size_t moe_csr_scratch_bytes(int64_t T);
// Token CSR: offsets_T1 [T + 1] and token_rows [R], each token's rows ascending (= ascending expert: rows are
// expert-major). counts_T: scratch of T int64. Any K.
void moe_token_csr(const int32_t* row_of_i, int64_t T, int64_t K, int64_t* counts_T, int64_t* offsets_T1,
                   int32_t* token_rows, void* scratch, size_t scratch_bytes, cudaStream_t s);

// dst[r] = src[idx[r]] for rows of row_bytes bytes (idx[r] < 0: a zero row). 16-byte loads when the rows allow.
void moe_gather_rows(const void* src, const int32_t* idx, void* dst, int64_t R, int64_t row_bytes, cudaStream_t s);
// The same with an f32 source and a bf16 destination of H columns (round to nearest even).
void moe_gather_rows_f32_to_bf16(const float* src, const int32_t* idx, void* dst, int64_t R, int64_t H, cudaStream_t s);
// dst[idx[r]] = src[r] (idx a permutation into dst's rows; no two r share a target).
void moe_scatter_rows(const void* src, const int32_t* idx, void* dst, int64_t R, int64_t row_bytes, cudaStream_t s);
// dst[t] = Σ src[rows[i]] for i in [offsets[t], offsets[t+1]), in that order, from 0 (the CPU's order: the same bits);
// src f32 or, when src_bf16, bf16 rows widened as they are read (the sum in f32 either way).
void moe_sum_rows_per_token(const void* src, bool src_bf16, const int64_t* offsets_T1, const int32_t* rows, float* dst,
                            int64_t T, int64_t H, cudaStream_t s);
// probs_R[r] = row_tk[r] >= 0 ? probs_TK[row_tk[r]] : 0.
void moe_gather_probs(const float* probs_TK, const int64_t* row_tk, float* probs_R, int64_t R, cudaStream_t s);
// dprobs_TK[row_tk[r]] = dprobs_R[r] where row_tk[r] >= 0 (dprobs_TK zeroed by the caller; targets are unique).
void moe_scatter_probs(const float* dprobs_R, const int64_t* row_tk, float* dprobs_TK, int64_t R, cudaStream_t s);

}  // namespace moecore::launch
