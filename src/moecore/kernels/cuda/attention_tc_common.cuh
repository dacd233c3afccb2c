// Device helpers of the tensor-core attention kernels (attention_tc.cu, attention_tc_bwd.cu): bf16 tiles in shared
// memory, ldmatrix fragment loads and the m16n8k16 bf16 MMA.
//
// Fragment layouts of mma.sync.m16n8k16 (bf16 in, f32 accumulate), lane = 4·g + c (g = lane / 4, c = lane % 4):
//   A 16×16 (row-major): a0 = (g, 2c..2c+1), a1 = (g+8, 2c..), a2 = (g, 2c+8..), a3 = (g+8, 2c+8..)
//   B 16×8  (k × n):     b0 = (k 2c..2c+1, n g), b1 = (k 2c+8.., n g)
//   C 16×8  (f32):       c0, c1 = (g, 2c), (g, 2c+1); c2, c3 = (g+8, 2c), (g+8, 2c+1)
// Each 32-bit register holds two bf16, the lower column (or k) index in the low half. A C fragment pair of adjacent
// n-blocks, packed to bf16, is an A fragment (the score → probability reuse of FlashAttention-2).
//
// Tiles are bf16 rows of D elements padded to D + 8: the row stride is 16 bytes past a multiple of 128, so the 8
// rows one ldmatrix phase reads fall on distinct bank groups (no conflicts for D = 64 or 128).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace moecore::launch::tc {

constexpr int kThreads = 128;  // 4 warps, each owning 16 rows of the block's tile
// Blocks per SM the register budget aims at: D = 128 needs ~170 registers (64 accumulators alone), which spill
// at 3 blocks (168), so it gets 2; D = 64 fits 3 without spills.
template <int D>
constexpr int kMinBlocks = D <= 64 ? 3 : 2;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

template <int D>
constexpr int kStride = D + 8;  // bf16 elements per padded tile row

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x = lo (low half), round to nearest even
  return *reinterpret_cast<const uint32_t*>(&v);
}

// Rows [s0, s0 + R) of one head of two [S, B, N, D] f32 tensors with the same layout (K and V, or Q and dO; row s at
// base + s·row_stride), times mul_a / mul_b, rounded to bf16 into the padded tiles dst_a / dst_b; rows at or past S
// are zero (they must not carry garbage into the MMAs). Every load of both tiles is issued before the first
// conversion, so one memory round trip covers both (the blocks' only latency hiding besides the other resident
// blocks); that costs R·D/16 registers per thread for the staging, which the kernels' budgets include.
template <int D, int R>
__device__ __forceinline__ void load_tiles(__nv_bfloat16* dst_a, const float* base_a, float mul_a, __nv_bfloat16* dst_b,
                                           const float* base_b, float mul_b, int64_t s0, int64_t S,
                                           int64_t row_stride) {
  constexpr int C4 = D / 4, kIters = R * C4 / kThreads;
  static_assert(R * C4 % kThreads == 0, "tile must split evenly over the block");
  float4 xa[kIters], xb[kIters];
#pragma unroll
  for (int it = 0; it < kIters; it++) {
    const int idx = threadIdx.x + it * kThreads, r = idx / C4, c = idx % C4;
    const int64_t s = s0 + r;
    const float4 zero = make_float4(0, 0, 0, 0);
    xa[it] = s < S ? __ldg(reinterpret_cast<const float4*>(base_a + s * row_stride) + c) : zero;
    xb[it] = s < S ? __ldg(reinterpret_cast<const float4*>(base_b + s * row_stride) + c) : zero;
  }
#pragma unroll
  for (int it = 0; it < kIters; it++) {
    const int idx = threadIdx.x + it * kThreads, r = idx / C4, c = idx % C4;
    uint2 w;
    w.x = pack_bf16(xa[it].x * mul_a, xa[it].y * mul_a);
    w.y = pack_bf16(xa[it].z * mul_a, xa[it].w * mul_a);
    *reinterpret_cast<uint2*>(dst_a + r * kStride<D> + 4 * c) = w;
    w.x = pack_bf16(xb[it].x * mul_b, xb[it].y * mul_b);
    w.y = pack_bf16(xb[it].z * mul_b, xb[it].w * mul_b);
    *reinterpret_cast<uint2*>(dst_b + r * kStride<D> + 4 * c) = w;
  }
}

// One tile, as load_tiles (the forward's Q̂).
template <int D, int R>
__device__ __forceinline__ void load_tile(__nv_bfloat16* dst, const float* base, float mul, int64_t s0, int64_t S,
                                          int64_t row_stride) {
  constexpr int C4 = D / 4, kIters = R * C4 / kThreads;
  static_assert(R * C4 % kThreads == 0, "tile must split evenly over the block");
  float4 x[kIters];
#pragma unroll
  for (int it = 0; it < kIters; it++) {
    const int idx = threadIdx.x + it * kThreads, r = idx / C4, c = idx % C4;
    const int64_t s = s0 + r;
    x[it] = s < S ? __ldg(reinterpret_cast<const float4*>(base + s * row_stride) + c) : make_float4(0, 0, 0, 0);
  }
#pragma unroll
  for (int it = 0; it < kIters; it++) {
    const int idx = threadIdx.x + it * kThreads, r = idx / C4, c = idx % C4;
    uint2 w;
    w.x = pack_bf16(x[it].x * mul, x[it].y * mul);
    w.y = pack_bf16(x[it].z * mul, x[it].w * mul);
    *reinterpret_cast<uint2*>(dst + r * kStride<D> + 4 * c) = w;
  }
}

#ifndef MOE_TC_EMULATE  // scripts/attention_tc_emulate.cpp supplies host versions of these five
// The block's dynamic shared memory (16-byte aligned: ldmatrix rows and the uint2 tile stores need it).
__device__ __forceinline__ unsigned char* dyn_smem() {
  extern __shared__ __align__(16) unsigned char smem_[];
  return smem_;
}

// ldmatrix: lane l gives the address of row l % 8 of 8×8 matrix l / 8; register j receives, for lane 4g + c,
// row g, columns 2c, 2c+1 of matrix j (trans: row 2c, 2c+1 of column g).
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const __nv_bfloat16* row) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], const __nv_bfloat16* row) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// acc += A·B, one 16×8×16 bf16 MMA with f32 accumulation.
__device__ __forceinline__ void mma(float (&acc)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
#endif

// A fragment of rows m0..m0+15, columns k0..k0+15 of a row-major [m][k] tile.
template <int D>
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const __nv_bfloat16* tile, int m0, int k0) {
  const int lane = threadIdx.x & 31;
  const int row = m0 + (lane & 7) + 8 * ((lane >> 3) & 1), col = k0 + 8 * (lane >> 4);
  ldsm_x4(a, tile + row * kStride<D> + col);
}

// B fragments of two n-blocks (n0, n0+8) × k0..k0+15 from a tile stored [n][k] row-major (Bᵀ: keys × channels
// for Q·Kᵀ): b = {b0(n0), b1(n0), b0(n0+8), b1(n0+8)}.
template <int D>
__device__ __forceinline__ void load_b_nk(uint32_t (&b)[4], const __nv_bfloat16* tile, int n0, int k0) {
  const int lane = threadIdx.x & 31;
  const int row = n0 + (lane & 7) + 8 * (lane >> 4), col = k0 + 8 * ((lane >> 3) & 1);
  ldsm_x4(b, tile + row * kStride<D> + col);
}

// The same two B fragments from a tile stored [k][n] row-major (V for P·V: keys × channels), transposed by ldmatrix.
template <int D>
__device__ __forceinline__ void load_b_kn(uint32_t (&b)[4], const __nv_bfloat16* tile, int k0, int n0) {
  const int lane = threadIdx.x & 31;
  const int row = k0 + (lane & 7) + 8 * ((lane >> 3) & 1), col = n0 + 8 * (lane >> 4);
  ldsm_x4_t(b, tile + row * kStride<D> + col);
}

// C fragments of n-blocks 2kk and 2kk+1 of a 16-row strip, rounded to bf16, as the A fragment of k-block kk.
__device__ __forceinline__ void c_to_a(uint32_t (&a)[4], const float (&lo)[4], const float (&hi)[4]) {
  a[0] = pack_bf16(lo[0], lo[1]);
  a[1] = pack_bf16(lo[2], lo[3]);
  a[2] = pack_bf16(hi[0], hi[1]);
  a[3] = pack_bf16(hi[2], hi[3]);
}

}  // namespace moecore::launch::tc
