// The shared-expert gate's kernels (see launch_shared_gate.h); the math of moe/shared_experts.cpp's CPU loops.
#include "moecore/kernels/cuda/common.cuh"
#include "moecore/kernels/cuda/launch_shared_gate.h"

namespace moecore::launch {

namespace {
__global__ void sigmoid_k(float* g, int64_t T) {
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < T; t += int64_t(gridDim.x) * blockDim.x)
    g[t] = 1.0f / (1.0f + expf(-g[t]));
}
__global__ void row_scale_k(const float* m, const float* g, float* y, int64_t T, int64_t H) {
  const int64_t n = T * H;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    y[i] = m[i] * g[i / H];
}
// One block per token: dm = dy·g, and the row sum Σ_h dy·m over a fixed tree.
__global__ void gate_backward_k(const float* dy, const float* g, const float* m, float* dm, float* dz, int64_t H) {
  __shared__ float sm[kThreads];
  const int64_t t = blockIdx.x;
  const float gt = g[t];
  float acc = 0;
  for (int64_t h = threadIdx.x; h < H; h += blockDim.x) {
    const float d = dy[t * H + h];
    dm[t * H + h] = d * gt;
    acc += d * m[t * H + h];
  }
  const float s = block_sum(acc, sm);
  if (threadIdx.x == 0) dz[t] = s * gt * (1.0f - gt);
}
}  // namespace

void shared_gate_forward(float* gate_T, const float* m_TH, float* y_TH, int64_t T, int64_t H, cudaStream_t s) {
  sigmoid_k<<<grid_for(T), kThreads, 0, s>>>(gate_T, T);
  row_scale_k<<<grid_for(T * H), kThreads, 0, s>>>(m_TH, gate_T, y_TH, T, H);
}

void shared_gate_backward(const float* dy_TH, const float* gate_T, const float* m_TH, float* dm_TH, float* dz_T,
                          int64_t T, int64_t H, cudaStream_t s) {
  if (T == 0) return;
  gate_backward_k<<<static_cast<unsigned>(T), kThreads, 0, s>>>(dy_TH, gate_T, m_TH, dm_TH, dz_T, H);
}

}  // namespace moecore::launch
