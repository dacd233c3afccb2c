// Pointer-level launchers of the two-stage column reductions (col_reduce.cu), for the weight and bias gradients
// summed over all rows: stage 1 sums every chunk of kColChunk rows per column into scratch[chunk, column] (a warp
// reads 32 adjacent columns of a row, 8 warps split the chunk's rows and are added in warp order); stage 2 adds the
// chunks of each column in a fixed order to the gradient. The chunk size is a constant, not a function of the GPU,
// so the bits are the same on every run and every device; they differ from the CPU kernels' row-by-row sums by
// rounding only. f32 (the bias gradient's rows also bf16); the gradients are accumulated into (+=).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace moecore::launch {

constexpr int64_t kColChunk = 256;
inline int64_t col_chunks(int64_t rows) {
  return (rows + kColChunk - 1) / kColChunk;
}
// Floats of device scratch a reduction of `rows` rows × N columns with `outputs` sums needs (from the caching
// allocator, on the launch's stream).
inline int64_t col_reduce_scratch_floats(int64_t rows, int64_t N, int outputs) {
  return col_chunks(rows) * N * outputs;
}

// db[j] += Σ_t dy[t, j].
void col_sums_two_stage(const float* dy, float* db, float* scratch, int64_t rows, int64_t N, cudaStream_t s);
// db[j] += Σ_t w[t]·dy[t, j] (w null: 1); dy f32, or bf16 when dy_bf16 (widened as it is read).
void weighted_col_sums_two_stage(const void* dy, bool dy_bf16, const float* w, float* db, float* scratch, int64_t rows,
                                 int64_t N, cudaStream_t s);
// dw[j] += Σ_t dy[t, j]·x[t, j]·rstd[t].
void rmsnorm_dw_two_stage(const float* dy, const float* x, const float* rstd, float* dw, float* scratch, int64_t rows,
                          int64_t H, cudaStream_t s);
// dw[j] += Σ_t dy[t, j]·(x[t, j] − mean[t])·rstd[t]; db[j] += Σ_t dy[t, j]. Scratch for 2 outputs.
void layernorm_dwb_two_stage(const float* dy, const float* x, const float* mean, const float* rstd, float* dw,
                             float* db, float* scratch, int64_t rows, int64_t H, cudaStream_t s);
// The one-thread-per-column walk these replaced: the micro-benchmark's baseline (tests/cuda/test_cuda_reductions.cpp).
void col_sums_sequential(const float* dy, float* db, int64_t rows, int64_t N, cudaStream_t s);

}  // namespace moecore::launch
