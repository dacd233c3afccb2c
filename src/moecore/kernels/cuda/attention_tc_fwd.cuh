// Causal GQA attention forward on tensor cores (the bf16 path; launch_attention_tc.h). FlashAttention-2 style: a
// block of 4 warps owns 64 query rows of one (batch, head), 16 rows per warp; it walks the key tiles of 64 from
// the first up to its diagonal (tiles wholly above it are never loaded), computing S = Q̂·K̂ᵀ with m16n8k16 bf16
// MMAs, an online softmax in f32 (in log2 units, exp2), and O += bf16(P)·V̂. Q̂ = bf16(scale·q), K̂, V̂ = bf16 of the
// f32 inputs, converted while the tiles are staged in shared memory: the CPU bf16 kernel's rounding points.
// Deterministic: each output row has one writer and every sum runs in a fixed order.
// kDrop: attention dropout (launch.h). The block draws each key tile's keep bits into shared memory (64 rows × 64
// keys, the CPU's Philox coordinates: attention_dropout.cuh) while the tile loads; l sums the undropped P and
// O += bf16(P ⊙ Z)·V̂, the CPU kernels' order of the multiply and the rounding.
// Spans (launch_attention_tc.h): Sq query rows against Sk keys at offset off (key j visible to row i when
// j ≤ i + off): key tiles past the tile's last row are never loaded, tiles that cross it (or Sk) are masked, and a
// row that sees no key (m still −inf) gets o 0 and lse −inf. For the whole sequence (Sq = Sk, off 0) every
// visited tile's rows see key j0, so m is finite and those guards change no bits.
#pragma once

#include "moecore/kernels/cuda/attention_dropout.cuh"
#include "moecore/kernels/cuda/attention_tc_common.cuh"

namespace moecore::launch::tc {

constexpr int kBr = 64, kBc = 64;  // query rows and keys per tile

// With dropout, kBr 64-bit keep-bit rows follow the tiles.
template <int D, bool kDrop = false>
constexpr int fwd_smem_bytes() {
  return (kBr + 2 * kBc) * kStride<D> * 2 + (kDrop ? kBr * 8 : 0);
}

template <int D, bool kDrop>
__global__ void __launch_bounds__(kThreads, kMinBlocks<D>)
    fwd_tc_k(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
             float* __restrict__ o, float* __restrict__ lse, int64_t Sq, int64_t Sk, int64_t off, int64_t B, int64_t Nq,
             int64_t Nkv, float scale, const __grid_constant__ DropoutParams drop) {
  unsigned char* smem = dyn_smem();
  __nv_bfloat16* Qs = reinterpret_cast<__nv_bfloat16*>(smem);
  __nv_bfloat16* Ks = Qs + kBr * kStride<D>;
  __nv_bfloat16* Vs = Ks + kBc * kStride<D>;
  uint64_t* keep_s = reinterpret_cast<uint64_t*>(Vs + kBc * kStride<D>);  // [kBr] when kDrop

  // The longest rows (the last query tiles) start first, so the short ones fill the tail of the grid.
  // Sequence positions fit an int (attention_tc_supported): 32-bit index math in the loop saves registers.
  const int Sqn = static_cast<int>(Sq), Skn = static_cast<int>(Sk), offn = static_cast<int>(off);
  const int tiles = (Sqn + kBr - 1) / kBr, tile = tiles - 1 - static_cast<int>(blockIdx.y);
  const int64_t bh = blockIdx.x, b = bh / Nq, h = bh % Nq, hk = h / (Nq / Nkv);
  const int i0 = tile * kBr;
  const int64_t q_stride = B * Nq * D, kv_stride = B * Nkv * D;
  const float* qh = q + (b * Nq + h) * D;
  const float* kh = k + (b * Nkv + hk) * D;
  const float* vh = v + (b * Nkv + hk) * D;
  const HeadMask hm = kDrop ? HeadMask(drop, b, h) : HeadMask{};

  load_tile<D, kBr>(Qs, qh, scale, i0, Sq, q_stride);
  __syncthreads();
  // This warp's 16 rows of Q̂ are re-read from shared memory for every key tile (8 ldmatrix per tile): 32 more
  // registers would not fit beside the accumulators and the K/V staging of load_tiles.
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;

  float acc[D / 8][4] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // rows g and g+8: running max (log2 units), sum
  const int row_lo = i0 + warp * 16, row0 = row_lo + g, row1 = row0 + 8;
  const int last = (i0 + kBr < Sqn ? i0 + kBr : Sqn) + offn;  // past the last row's last visible key
  const int kend = last < Skn ? last : Skn;
  for (int j0 = 0; j0 < kend; j0 += kBc) {
    __syncthreads();  // every warp is done with the previous K/V tile
    load_tiles<D, kBc>(Ks, kh, 1.0f, Vs, vh, 1.0f, j0, Sk, kv_stride);
    if constexpr (kDrop) tile_keep_bits<kBr, kThreads>(keep_s, drop, hm, i0, j0);
    __syncthreads();

    float s[kBc / 8][4] = {};
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) {
      uint32_t qa[4];
      load_a<D>(qa, Qs, warp * 16, kk * 16);
#pragma unroll
      for (int np = 0; np < kBc / 16; np++) {
        uint32_t bf[4];
        load_b_nk<D>(bf, Ks, np * 16, kk * 16);
        mma(s[2 * np], qa, bf[0], bf[1]);
        mma(s[2 * np + 1], qa, bf[2], bf[3]);
      }
    }

    // Scores in log2 units; keys past the row (the diagonal tile) or past Sk are −inf.
    const bool diag = j0 + kBc - 1 > row_lo + offn || j0 + kBc > Skn;
    float mx[2] = {m[0], m[1]};
#pragma unroll
    for (int n = 0; n < kBc / 8; n++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const int key = j0 + n * 8 + 2 * c + (e & 1), row = e < 2 ? row0 : row1;
        float x = s[n][e] * kLog2e;
        if (diag && (key > row + offn || key >= Skn)) x = -INFINITY;
        s[n][e] = x;
        mx[e >> 1] = fmaxf(mx[e >> 1], x);
      }
#pragma unroll
    for (int r = 0; r < 2; r++) {  // a row's 64 columns are spread over the 4 lanes of its quad
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
    }
    // A row that has seen no key yet keeps m = −inf: subtract 0 instead, so its P and corr are 0, not NaN.
    const float ms0 = mx[0] == -INFINITY ? 0.0f : mx[0], ms1 = mx[1] == -INFINITY ? 0.0f : mx[1];
    const float corr0 = exp2f(m[0] - ms0), corr1 = exp2f(m[1] - ms1);  // 0 on the first tile (m = −inf)
    m[0] = mx[0];
    m[1] = mx[1];
    l[0] *= corr0;
    l[1] *= corr1;
#pragma unroll
    for (int n = 0; n < D / 8; n++) {
      acc[n][0] *= corr0;
      acc[n][1] *= corr0;
      acc[n][2] *= corr1;
      acc[n][3] *= corr1;
    }
#pragma unroll
    for (int n = 0; n < kBc / 8; n++) {
      s[n][0] = exp2f(s[n][0] - ms0);
      s[n][1] = exp2f(s[n][1] - ms0);
      s[n][2] = exp2f(s[n][2] - ms1);
      s[n][3] = exp2f(s[n][3] - ms1);
      l[0] += s[n][0] + s[n][1];
      l[1] += s[n][2] + s[n][3];
    }
    if constexpr (kDrop) {  // P ⊙ Z: bit (key − j0) of this lane's two rows
      const uint64_t z0 = keep_s[warp * 16 + g], z1 = keep_s[warp * 16 + g + 8];
#pragma unroll
      for (int n = 0; n < kBc / 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
          const int col = n * 8 + 2 * c + (e & 1);
          s[n][e] *= (((e < 2 ? z0 : z1) >> col) & 1u) ? drop.keep : 0.0f;
        }
    }

    // O += bf16(P)·V̂: the score fragments become A fragments without leaving registers.
#pragma unroll
    for (int kk = 0; kk < kBc / 16; kk++) {
      uint32_t pf[4];
      c_to_a(pf, s[2 * kk], s[2 * kk + 1]);
#pragma unroll
      for (int np = 0; np < D / 16; np++) {
        uint32_t bf[4];
        load_b_kn<D>(bf, Vs, kk * 16, np * 16);
        mma(acc[2 * np], pf, bf[0], bf[1]);
        mma(acc[2 * np + 1], pf, bf[2], bf[3]);
      }
    }
  }

#pragma unroll
  for (int r = 0; r < 2; r++) {  // the quad's partial sums, in a fixed butterfly order
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
  }
  const float inv0 = l[0] > 0.0f ? 1.0f / l[0] : 0.0f, inv1 = l[1] > 0.0f ? 1.0f / l[1] : 0.0f;
  if (row0 < Sq) {
    float* out = o + (b * Nq + h) * D + row0 * q_stride;
#pragma unroll
    for (int n = 0; n < D / 8; n++)
      *reinterpret_cast<float2*>(out + n * 8 + 2 * c) = make_float2(acc[n][0] * inv0, acc[n][1] * inv0);
    if (c == 0) lse[bh * Sq + row0] = l[0] > 0.0f ? m[0] * kLn2 + logf(l[0]) : -INFINITY;
  }
  if (row1 < Sq) {
    float* out = o + (b * Nq + h) * D + row1 * q_stride;
#pragma unroll
    for (int n = 0; n < D / 8; n++)
      *reinterpret_cast<float2*>(out + n * 8 + 2 * c) = make_float2(acc[n][2] * inv1, acc[n][3] * inv1);
    if (c == 0) lse[bh * Sq + row1] = l[1] > 0.0f ? m[1] * kLn2 + logf(l[1]) : -INFINITY;
  }
}

}  // namespace moecore::launch::tc
