// Hidden dropout on the GPU (launch_dropout.h): the CPU kernel's mask (kernels/cpu/dropout.cpp), regenerated from
// the same Philox coordinates (dropout_philox.h), never stored. Not the attention kernels' dropout, which drop
// probabilities inside those kernels.
#include "moecore/kernels/cuda/common.cuh"
#include "moecore/kernels/cuda/launch_dropout.h"
#include "moecore/kernels/dropout_philox.h"

namespace moecore::launch {

namespace {
// One thread per Philox block: the (up to) 4 columns 4g .. 4g+3 of one row s·B + b, each multiplied by keep or 0 (a
// NaN or infinity stays one where dropped, as on the CPU).
__global__ void dropout_k(const float* __restrict__ x, float* y, int64_t rows, int64_t C,
                          const __grid_constant__ DropoutParams p) {
  const int64_t groups = (C + 3) / 4, n = rows * groups;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / groups, g = i % groups, s = t / p.samples, b = t % p.samples;
    const uint32_t bits =
        kernels::dropout_philox::keep_nibble(p.key, p.threshold, static_cast<uint64_t>(p.sample[b]),
                                             static_cast<uint64_t>(p.row_offset + s), static_cast<uint64_t>(g));
    const int64_t c0 = g * 4, e = C - c0 < 4 ? C - c0 : 4;
    const float* xr = x + t * C + c0;
    float* yr = y + t * C + c0;
    for (int64_t w = 0; w < e; w++) yr[w] = xr[w] * ((bits >> w) & 1u ? p.keep : 0.0f);
  }
}
}  // namespace

void dropout_apply(const float* x, float* y, int64_t rows, int64_t C, const DropoutParams& p, cudaStream_t s) {
  const int64_t n = rows * ((C + 3) / 4);
  if (n > 0) dropout_k<<<grid_for(n), kThreads, 0, s>>>(x, y, rows, C, p);
}

}  // namespace moecore::launch
