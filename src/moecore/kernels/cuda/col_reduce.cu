// Column reductions over many rows (see launch_col_reduce.h): the bias gradient Σ_t dy, RMSNorm's dw and
// LayerNorm's dw/db, in two fixed-order stages so that a 128-wide qk-norm over 131,072 rows fills the GPU instead of
// running 128 threads down every row. Not for sums over a few rows (position_rows.cu, mla.cu walk those directly).
#include "moecore/kernels/cuda/common.cuh"
#include "moecore/kernels/cuda/launch_col_reduce.h"

namespace moecore::launch {

namespace {
constexpr int kWarps = 8;  // stage 1: 8 warps split a chunk's rows, each lane owns one column
constexpr int64_t kRowsPerWarp = kColChunk / kWarps;
constexpr int kFinishWarps = 32;  // stage 2: 32 warps split a column's chunks
static_assert(kColChunk % kWarps == 0, "a chunk splits evenly over the warps");

// What is summed per (row t, column j): 0 the bias gradient dy, times the row's weight w[t] where weights are given
// (the expert fc2 bias's routing probabilities), 1 RMSNorm's dy·x·rstd[t], 2 LayerNorm's dy·(x − mean[t])·rstd[t]
// and dy (two outputs). `row` is the per-row factor: the weights (or null) for kind 0, rstd for the norms. dy is
// f32, or bf16 (G) for the bias gradient.
template <int kKind, typename G>
__global__ void col_partial_k(const G* dy, const float* x, const float* mean, const float* row, float* part,
                              int64_t rows, int64_t N, int64_t C) {
  __shared__ float sm[2][kWarps][32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t j = blockIdx.x * int64_t(32) + lane;
  for (int64_t c = blockIdx.y; c < C; c += gridDim.y) {
    // Rows [r0, r1) of chunk c belong to this warp; a warp reads 32 adjacent columns of a row (coalesced).
    const int64_t r0 = c * kColChunk + warp * kRowsPerWarp;
    const int64_t r1 = r0 + kRowsPerWarp < rows ? r0 + kRowsPerWarp : rows;
    float a = 0.0f, b = 0.0f;
    if (j < N) {
#pragma unroll 4
      for (int64_t t = r0; t < r1; t++) {
        const float g = to_f32(dy[t * N + j]);
        if constexpr (kKind == 0) {
          a += row ? g * row[t] : g;
        } else if constexpr (kKind == 1) {
          a += g * x[t * N + j] * row[t];
        } else {
          a += g * (x[t * N + j] - mean[t]) * row[t];
          b += g;
        }
      }
    }
    sm[0][warp][lane] = a;
    sm[1][warp][lane] = b;
    __syncthreads();
    if (warp == 0 && j < N) {  // the warps' sums in warp order: a fixed tree for every run and every GPU
      float s = 0.0f, sb = 0.0f;
      for (int w = 0; w < kWarps; w++) {
        s += sm[0][w][lane];
        sb += sm[1][w][lane];
      }
      part[c * N + j] = s;
      if constexpr (kKind == 2) part[(C + c) * N + j] = sb;
    }
    __syncthreads();
  }
}

// out0[j] += Σ_c part[c, j] (and out1 from the second [C, N] half): warp w sums chunks [C·w/32, C·(w+1)/32) in
// order, then the warps' sums are added in warp order.
template <int kOutputs>
__global__ void col_finish_k(const float* part, int64_t C, int64_t N, float* out0, float* out1) {
  __shared__ float sm[2][kFinishWarps][32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t j = blockIdx.x * int64_t(32) + lane;
  const int64_t c0 = C * warp / kFinishWarps, c1 = C * (warp + 1) / kFinishWarps;
  float a = 0.0f, b = 0.0f;
  if (j < N) {
    for (int64_t c = c0; c < c1; c++) {
      a += part[c * N + j];
      if constexpr (kOutputs == 2) b += part[(C + c) * N + j];
    }
  }
  sm[0][warp][lane] = a;
  sm[1][warp][lane] = b;
  __syncthreads();
  if (warp == 0 && j < N) {
    float s = 0.0f, sb = 0.0f;
    for (int w = 0; w < kFinishWarps; w++) {
      s += sm[0][w][lane];
      sb += sm[1][w][lane];
    }
    out0[j] += s;
    if constexpr (kOutputs == 2) out1[j] += sb;
  }
}

// The order these kernels replaced (one thread per column walking every row), kept as the benchmark's baseline.
__global__ void col_sums_sequential_k(const float* dy, float* db, int64_t rows, int64_t N) {
  const int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (j >= N) return;
  float a = 0;
  for (int64_t t = 0; t < rows; t++) a += dy[t * N + j];
  db[j] += a;
}

template <int kKind, typename G = float>
void col_reduce(const G* dy, const float* x, const float* mean, const float* row, float* out0, float* out1,
                float* scratch, int64_t rows, int64_t N, cudaStream_t s) {
  if (rows <= 0 || N <= 0) return;
  const int64_t C = col_chunks(rows);
  const unsigned col_blocks = static_cast<unsigned>((N + 31) / 32);
  const dim3 grid1(col_blocks, static_cast<unsigned>(C < 65535 ? C : 65535));
  col_partial_k<kKind, G><<<grid1, kWarps * 32, 0, s>>>(dy, x, mean, row, scratch, rows, N, C);
  col_finish_k<kKind == 2 ? 2 : 1><<<col_blocks, kFinishWarps * 32, 0, s>>>(scratch, C, N, out0, out1);
}
}  // namespace

void col_sums_two_stage(const float* dy, float* db, float* scratch, int64_t rows, int64_t N, cudaStream_t s) {
  col_reduce<0>(dy, nullptr, nullptr, nullptr, db, nullptr, scratch, rows, N, s);
}
void weighted_col_sums_two_stage(const void* dy, bool dy_bf16, const float* w, float* db, float* scratch, int64_t rows,
                                 int64_t N, cudaStream_t s) {
  if (dy_bf16)
    col_reduce<0>(static_cast<const __nv_bfloat16*>(dy), nullptr, nullptr, w, db, nullptr, scratch, rows, N, s);
  else
    col_reduce<0>(static_cast<const float*>(dy), nullptr, nullptr, w, db, nullptr, scratch, rows, N, s);
}
void rmsnorm_dw_two_stage(const float* dy, const float* x, const float* rstd, float* dw, float* scratch, int64_t rows,
                          int64_t H, cudaStream_t s) {
  col_reduce<1>(dy, x, nullptr, rstd, dw, nullptr, scratch, rows, H, s);
}
void layernorm_dwb_two_stage(const float* dy, const float* x, const float* mean, const float* rstd, float* dw,
                             float* db, float* scratch, int64_t rows, int64_t H, cudaStream_t s) {
  col_reduce<2>(dy, x, mean, rstd, dw, db, scratch, rows, H, s);
}
void col_sums_sequential(const float* dy, float* db, int64_t rows, int64_t N, cudaStream_t s) {
  if (N > 0) col_sums_sequential_k<<<grid_for(N), kThreads, 0, s>>>(dy, db, rows, N);
}

}  // namespace moecore::launch
