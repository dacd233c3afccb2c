// Multi-latent attention's head sum (see launch_mla.h): one thread per destination element, heads added in
// ascending order into an accumulator of the element type starting at 0, as the CPU loop does.
#include "moecore/kernels/cuda/common.cuh"
#include "moecore/kernels/cuda/launch_mla.h"

namespace moecore::launch {

namespace {
template <typename T>
__global__ void head_sum_k(const T* src, int64_t Ns, int64_t Ws, int64_t s0, T* dst, int64_t Wd, int64_t d0, int64_t w,
                           int64_t R) {
  const int64_t n = R * w;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = e / w, i = e % w;
    const T* s = src + r * Ns * Ws + s0 + i;
    T acc = 0;
    for (int64_t h = 0; h < Ns; h++) acc += s[h * Ws];
    dst[r * Wd + d0 + i] = acc;
  }
}

template <typename T>
void head_sum(const T* src, int64_t Ns, int64_t Ws, int64_t s0, T* dst, int64_t Wd, int64_t d0, int64_t w, int64_t R,
              cudaStream_t s) {
  if (R * w == 0) return;
  head_sum_k<T><<<grid_for(R * w), kThreads, 0, s>>>(src, Ns, Ws, s0, dst, Wd, d0, w, R);
}
}  // namespace

void mla_head_sum_f32(const float* src, int64_t Ns, int64_t Ws, int64_t s0, float* dst, int64_t Wd, int64_t d0,
                      int64_t w, int64_t R, cudaStream_t s) {
  head_sum(src, Ns, Ws, s0, dst, Wd, d0, w, R, s);
}
void mla_head_sum_f64(const double* src, int64_t Ns, int64_t Ws, int64_t s0, double* dst, int64_t Wd, int64_t d0,
                      int64_t w, int64_t R, cudaStream_t s) {
  head_sum(src, Ns, Ws, s0, dst, Wd, d0, w, R, s);
}

}  // namespace moecore::launch
