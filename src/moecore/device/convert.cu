// The dtype conversion kernel behind Tensor::to between floating dtypes on a GPU (device/launch_convert.h).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "moecore/device/launch_convert.h"

namespace moecore::launch {

namespace {
constexpr int kThreads = 256;

unsigned grid_for(int64_t n) {
  const int64_t g = (n + kThreads - 1) / kThreads, cap = 65535LL * 8;
  return static_cast<unsigned>(g < 1 ? 1 : (g > cap ? cap : g));
}

template <typename D, typename S>
__global__ void convert_k(D* d, const S* s, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    if constexpr (sizeof(D) == 2)
      d[i] = __float2bfloat16_rn(static_cast<float>(s[i]));
    else if constexpr (sizeof(S) == 2)
      d[i] = static_cast<D>(__bfloat162float(s[i]));
    else
      d[i] = static_cast<D>(s[i]);
  }
}

template <typename D>
void convert_from(D* d, const void* src, int st, int64_t n, cudaStream_t s) {
  const unsigned g = grid_for(n);
  if (st == 0) convert_k<<<g, kThreads, 0, s>>>(d, static_cast<const float*>(src), n);
  if (st == 1) convert_k<<<g, kThreads, 0, s>>>(d, static_cast<const __nv_bfloat16*>(src), n);
  if (st == 2) convert_k<<<g, kThreads, 0, s>>>(d, static_cast<const double*>(src), n);
}

}  // namespace

void convert(void* dst, int dt, const void* src, int st, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  if (dt == 0) convert_from(static_cast<float*>(dst), src, st, n, s);
  if (dt == 1) convert_from(static_cast<__nv_bfloat16*>(dst), src, st, n, s);
  if (dt == 2) convert_from(static_cast<double*>(dst), src, st, n, s);
}

}  // namespace moecore::launch
