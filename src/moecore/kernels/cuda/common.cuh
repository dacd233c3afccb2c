// Shared device helpers of the .cu files: grid sizing, block reductions in a fixed order, bf16 rounding.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace moecore::launch {

constexpr int kThreads = 256;

inline unsigned grid_for(int64_t n, int threads = kThreads, int64_t cap = 65535LL * 8) {
  int64_t g = (n + threads - 1) / threads;
  if (g < 1) g = 1;
  return static_cast<unsigned>(g > cap ? cap : g);
}

__device__ __forceinline__ float round_bf16(float x) {
  return __bfloat162float(__float2bfloat16_rn(x));
}
// An f32 or bf16 element read as f32 (bf16 widened exactly).
__device__ __forceinline__ float to_f32(float v) {
  return v;
}
__device__ __forceinline__ float to_f32(__nv_bfloat16 v) {
  return __bfloat162float(v);
}

// An f32 value stored as f32, or rounded to nearest even into a bf16.
__device__ __forceinline__ void store_f32(float* p, float v) {
  *p = v;
}
__device__ __forceinline__ void store_f32(__nv_bfloat16* p, float v) {
  *p = __float2bfloat16_rn(v);
}

// Sum over a block of kThreads threads; the tree is fixed, so the result does not depend on timing.
template <typename T>
__device__ T block_sum(T v, T* smem) {
  smem[threadIdx.x] = v;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) smem[threadIdx.x] += smem[threadIdx.x + s];
    __syncthreads();
  }
  T r = smem[0];
  __syncthreads();
  return r;
}

__device__ __forceinline__ float block_max(float v, float* smem) {
  smem[threadIdx.x] = v;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) smem[threadIdx.x] = fmaxf(smem[threadIdx.x], smem[threadIdx.x + s]);
    __syncthreads();
  }
  float r = smem[0];
  __syncthreads();
  return r;
}

// Butterfly sums over a warp: every lane ends with the same bits (each step adds the same two values, commutatively).
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Rows up to this wide are normalised by one warp each (8 rows per block) instead of a block per row: a 128-wide
// qk-norm over 131,072 rows is then 16,384 blocks of useful lanes rather than 131,072 blocks of half-idle threads and
// eight barriers. A constant, so the summation order does not depend on the device.
constexpr int64_t kWarpRowMaxH = 1024;
constexpr int kRowsPerBlock = kThreads / 32;
inline unsigned warp_row_grid(int64_t rows) {
  return static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock);
}

__device__ __forceinline__ int64_t id_at(const void* ids, bool ids64, int64_t i) {
  return ids64 ? static_cast<const int64_t*>(ids)[i] : static_cast<const int32_t*>(ids)[i];
}

}  // namespace moecore::launch
