// The emulation of the CUDA primitives the host-emulation harnesses compile kernels against (see
// cuda_kernels_emulate.cpp): blocks run one at a time, each CUDA thread a fiber (emu_fibers.h), __syncthreads a block
// barrier, __shfl_xor_sync an exchange through per-warp slots between two warp barriers, __shared__ a static (one block
// at a time), the _rn arithmetic intrinsics the plain host operations (the host build has no fused multiply-add).
// Included once, first.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "emu_fibers.h"

namespace emu {
// n floats uniform in [lo, hi) from seed: the harnesses' test inputs.
inline std::vector<float> rnd(size_t n, unsigned seed, float lo = -1, float hi = 1) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = u(g);
  return v;
}
dim3 bdim, gdim;
fibers::Barrier block_bar;
std::vector<fibers::Barrier> warp_bars;
std::vector<std::vector<float>> slots;
void launch(dim3 grid, dim3 block, const std::function<void()>& k) {
  bdim = block;
  gdim = grid;
  const unsigned nt = block.x;
  for (unsigned by = 0; by < grid.y; by++)
    for (unsigned bx = 0; bx < grid.x; bx++) {
      block_bar = fibers::Barrier{nt};
      warp_bars.assign(nt / 32, fibers::Barrier{32});
      slots.assign(nt / 32, std::vector<float>(32));
      fibers::run_block(nt, uint3{bx, by, 0}, k);
    }
}
}  // namespace emu
#define threadIdx (emu::tid)
#define blockIdx (emu::bid)
#define blockDim (emu::bdim)
#define gridDim (emu::gdim)
#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static
inline void __syncthreads() {
  emu::fibers::wait(emu::block_bar);
}
inline float __shfl_xor_sync(unsigned, float v, int m) {
  const int w = emu::tid.x / 32, l = emu::tid.x % 32;
  emu::slots[w][l] = v;
  emu::fibers::wait(emu::warp_bars[w]);
  const float r = emu::slots[w][l ^ m];
  emu::fibers::wait(emu::warp_bars[w]);
  return r;
}
template <typename T>
cudaError_t emu_malloc(T** p, size_t n) {
  *p = static_cast<T*>(malloc(n));
  return cudaSuccess;
}
#define cudaMallocAsync(pp, n, s) emu_malloc(pp, n)
#define cudaFreeAsync(p, s) (free(p), cudaSuccess)
#define cudaMemcpyAsync(d, s, n, k, st) (memcpy(d, s, n), cudaSuccess)
using std::isfinite;
inline float __fmul_rn(float a, float b) {
  return a * b;
}
inline float __fadd_rn(float a, float b) {
  return a + b;
}
inline float __fsub_rn(float a, float b) {
  return a - b;
}
