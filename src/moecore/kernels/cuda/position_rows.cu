// The learned position embedding's kernels (see launch_position_rows.h).
#include "moecore/kernels/cuda/common.cuh"
#include "moecore/kernels/cuda/launch_position_rows.h"

namespace moecore::launch {

namespace {
__global__ void add_rows_k(float* h, const float* t, int64_t S, int64_t B, int64_t H) {
  const int64_t n = S * B * H;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    h[i] += t[(i / (B * H)) * H + i % H];
}
// One thread per (s, j): the batch entries added in ascending order, as the CPU does.
__global__ void sum_rows_k(const float* dh, float* g, int64_t S, int64_t B, int64_t H) {
  const int64_t n = S * H;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t s = i / H, j = i % H;
    float acc = g[i];
    for (int64_t b = 0; b < B; b++) acc += dh[(s * B + b) * H + j];
    g[i] = acc;
  }
}
}  // namespace

void position_add_rows(float* h_SBH, const float* table_SH, int64_t S, int64_t B, int64_t H, cudaStream_t s) {
  if (S * B * H > 0) add_rows_k<<<grid_for(S * B * H), kThreads, 0, s>>>(h_SBH, table_SH, S, B, H);
}
void position_sum_rows(const float* dh_SBH, float* grad_SH, int64_t S, int64_t B, int64_t H, cudaStream_t s) {
  if (S * H > 0) sum_rows_k<<<grid_for(S * H), kThreads, 0, s>>>(dh_SBH, grad_SH, S, B, H);
}

}  // namespace moecore::launch
