// Causal GQA attention backward on tensor cores (the bf16 path; launch_attention_tc.h). Two kernels, no atomics:
//   dK/dV: a block per 64-key tile of one (batch, kv head) and one split of its group's query heads walks those
//          heads, then the 32-row query tiles from its diagonal down (with splits > 1 each split writes partial sums
//          that the launcher adds in split order: one sequence under GQA otherwise leaves too few blocks, each
//          walking all the group's heads), with Sᵀ = K̂·Q̂ᵀ and dPᵀ = V̂·dÔᵀ so that Pᵀ and dSᵀ come out as the A
//          fragments of dV += bf16(Pᵀ)·dÔ and dK += bf16(dSᵀ)·Q̂ (Q̂ carries the scale);
//   dQ:    a block per 64-row query tile walks the 64-key tiles up to its diagonal: S = Q̂·K̂ᵀ, dP = dÔ·V̂ᵀ,
//          dQ += bf16(dS)·K̂, scaled once at the end.
// P = exp(S − lse) is recomputed from the forward's lse; dS = P ⊙ (dP − Δ) with Δ = rowsum(dO ⊙ O) precomputed.
// Rounding points as in the CPU bf16 kernel: Q̂ = bf16(scale·q), K̂, V̂, dÔ, P and dS rounded to bf16, sums in f32.
// kDrop: attention dropout with the forward's keep bits Z, regenerated per step into shared memory
// (attention_dropout.cuh): dV += bf16(P ⊙ Z)ᵀ·dÔ and dS = P ⊙ (Z ⊙ dP − Δ), as the CPU kernels.
// Spans (launch_attention_tc.h): Sq query rows against Sk keys at offset off (key j visible to row i when
// j ≤ i + off): dK/dV walks the query tiles from the first row that sees its first key, dQ the key tiles up to its
// last row's last visible key; tiles crossing that boundary are masked. accumulate_dq adds the dQ term to dq.
#pragma once

#include "moecore/kernels/cuda/attention_dropout.cuh"
#include "moecore/kernels/cuda/attention_tc_common.cuh"

namespace moecore::launch::tc {

constexpr int kKvRows = 64, kKvQ = 32;   // dK/dV: keys per block, query rows per step
constexpr int kQRows = 64, kQKeys = 64;  // dQ: query rows per block, keys per step

// With dropout, a 64-bit keep-bit row per query row of a step follows.
template <int D, bool kDrop = false>
constexpr int dkv_smem_bytes() {
  return (2 * kKvRows + 2 * kKvQ) * kStride<D> * 2 + 2 * kKvQ * 4 + (kDrop ? kKvQ * 8 : 0);
}
template <int D, bool kDrop = false>
constexpr int dq_smem_bytes() {
  return (2 * kQRows + 2 * kQKeys) * kStride<D> * 2 + (kDrop ? kQRows * 8 : 0);
}

// lse in log2 units and Δ of rows [i0, i0 + n) of head row `bh` (S rows); rows at or past S get lse = +∞ (P = 0) and
// Δ = 0.
template <int N>
__device__ __forceinline__ void load_stats(float* lse2_s, float* delta_s, const float* lse, const float* delta,
                                           int64_t bh, int64_t i0, int64_t S) {
  for (int r = threadIdx.x; r < N; r += kThreads) {
    const int64_t i = i0 + r;
    lse2_s[r] = i < S ? lse[bh * S + i] * kLog2e : INFINITY;
    delta_s[r] = i < S ? delta[bh * S + i] : 0.0f;
  }
}

template <int D, bool kDrop>
__global__ void __launch_bounds__(kThreads, kMinBlocks<D>)
    dkv_tc_k(const float* __restrict__ dout, const float* __restrict__ q, const float* __restrict__ k,
             const float* __restrict__ v, const float* __restrict__ lse, const float* __restrict__ delta,
             float* __restrict__ dk, float* __restrict__ dv, int64_t Sq, int64_t Sk, int64_t off, int64_t B, int64_t Nq,
             int64_t Nkv, float scale, int splits, int64_t part_stride, const __grid_constant__ DropoutParams drop) {
  unsigned char* smem = dyn_smem();
  __nv_bfloat16* Ks = reinterpret_cast<__nv_bfloat16*>(smem);
  __nv_bfloat16* Vs = Ks + kKvRows * kStride<D>;
  __nv_bfloat16* Qs = Vs + kKvRows * kStride<D>;
  __nv_bfloat16* dOs = Qs + kKvQ * kStride<D>;
  float* lse2_s = reinterpret_cast<float*>(dOs + kKvQ * kStride<D>);
  float* delta_s = lse2_s + kKvQ;
  uint64_t* keep_s = reinterpret_cast<uint64_t*>(delta_s + kKvQ);  // [kKvQ] when kDrop: bit (key − j0) of query row

  // Sequence positions fit an int (attention_tc_supported): 32-bit index math in the loops saves registers.
  const int Sqn = static_cast<int>(Sq), offn = static_cast<int>(off);
  const int j0 = static_cast<int>(blockIdx.y) * kKvRows;  // tile 0 has the most query rows below it: it starts first
  // blockIdx.x = (b·Nkv + hk)·splits + z: split z takes heads [group·z/splits, group·(z+1)/splits) of the group and
  // writes its partial dK/dV at z·part_stride.
  const int64_t bhk = blockIdx.x / splits, z = blockIdx.x % splits, b = bhk / Nkv, hk = bhk % Nkv, group = Nq / Nkv;
  const int64_t g_begin = group * z / splits, g_end = group * (z + 1) / splits;
  const int64_t q_stride = B * Nq * D, kv_stride = B * Nkv * D;
  load_tiles<D, kKvRows>(Ks, k + (b * Nkv + hk) * D, 1.0f, Vs, v + (b * Nkv + hk) * D, 1.0f, j0, Sk, kv_stride);
  const int ifirst = j0 - offn > 0 ? j0 - offn : 0;  // the first query row that sees key j0

  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  const int key0 = j0 + warp * 16 + g, key1 = key0 + 8;  // this lane's keys (rows of Sᵀ)
  float dka[D / 8][4] = {}, dva[D / 8][4] = {};
  for (int64_t gi = g_begin; gi < g_end; gi++) {
    const int64_t h = hk * group + gi, bh = b * Nq + h;
    const float* qh = q + bh * D;
    const float* doh = dout + bh * D;
    const HeadMask hm = kDrop ? HeadMask(drop, b, h) : HeadMask{};
    for (int i0 = ifirst; i0 < Sqn; i0 += kKvQ) {  // query rows before ifirst see none of these keys
      __syncthreads();                             // the previous Q/dO tile is consumed (and K/V are staged)
      load_tiles<D, kKvQ>(Qs, qh, scale, dOs, doh, 1.0f, i0, Sq, q_stride);
      load_stats<kKvQ>(lse2_s, delta_s, lse, delta, bh, i0, Sq);
      if constexpr (kDrop) tile_keep_bits<kKvQ, kThreads>(keep_s, drop, hm, i0, j0);
      __syncthreads();

      float st[kKvQ / 8][4] = {}, dpt[kKvQ / 8][4] = {};  // Sᵀ and dPᵀ: this warp's 16 keys × 32 queries
#pragma unroll
      for (int kk = 0; kk < D / 16; kk++) {
        uint32_t ka[4], va[4];
        load_a<D>(ka, Ks, warp * 16, kk * 16);
        load_a<D>(va, Vs, warp * 16, kk * 16);
#pragma unroll
        for (int np = 0; np < kKvQ / 16; np++) {
          uint32_t bf[4];
          load_b_nk<D>(bf, Qs, np * 16, kk * 16);
          mma(st[2 * np], ka, bf[0], bf[1]);
          mma(st[2 * np + 1], ka, bf[2], bf[3]);
          load_b_nk<D>(bf, dOs, np * 16, kk * 16);
          mma(dpt[2 * np], va, bf[0], bf[1]);
          mma(dpt[2 * np + 1], va, bf[2], bf[3]);
        }
      }
      // Pᵀ into st, dSᵀ into dpt; a key past its query's position (key > query + off) has P = 0.
#pragma unroll
      for (int n = 0; n < kKvQ / 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
          const int col = n * 8 + 2 * c + (e & 1);
          const int query = i0 + col, key = e < 2 ? key0 : key1;
          const float p = key > query + offn ? 0.0f : exp2f(st[n][e] * kLog2e - lse2_s[col]);
          if constexpr (kDrop) {  // P ⊙ Z for dV; dS = P ⊙ (Z ⊙ dP − Δ)
            const float zf = ((keep_s[col] >> (key - j0)) & 1u) ? drop.keep : 0.0f;
            st[n][e] = p * zf;
            dpt[n][e] = p * (dpt[n][e] * zf - delta_s[col]);
          } else {
            st[n][e] = p;
            dpt[n][e] = p * (dpt[n][e] - delta_s[col]);
          }
        }
#pragma unroll
      for (int kk = 0; kk < kKvQ / 16; kk++) {
        uint32_t pa[4], dsa[4];
        c_to_a(pa, st[2 * kk], st[2 * kk + 1]);
        c_to_a(dsa, dpt[2 * kk], dpt[2 * kk + 1]);
#pragma unroll
        for (int np = 0; np < D / 16; np++) {
          uint32_t bf[4];
          load_b_kn<D>(bf, dOs, kk * 16, np * 16);
          mma(dva[2 * np], pa, bf[0], bf[1]);
          mma(dva[2 * np + 1], pa, bf[2], bf[3]);
          load_b_kn<D>(bf, Qs, kk * 16, np * 16);
          mma(dka[2 * np], dsa, bf[0], bf[1]);
          mma(dka[2 * np + 1], dsa, bf[2], bf[3]);
        }
      }
    }
  }

  const int64_t kv_head = (b * Nkv + hk) * D + z * part_stride;
  if (key0 < Sk) {
    float* dko = dk + kv_head + key0 * kv_stride;
    float* dvo = dv + kv_head + key0 * kv_stride;
#pragma unroll
    for (int n = 0; n < D / 8; n++) {
      *reinterpret_cast<float2*>(dko + n * 8 + 2 * c) = make_float2(dka[n][0], dka[n][1]);
      *reinterpret_cast<float2*>(dvo + n * 8 + 2 * c) = make_float2(dva[n][0], dva[n][1]);
    }
  }
  if (key1 < Sk) {
    float* dko = dk + kv_head + key1 * kv_stride;
    float* dvo = dv + kv_head + key1 * kv_stride;
#pragma unroll
    for (int n = 0; n < D / 8; n++) {
      *reinterpret_cast<float2*>(dko + n * 8 + 2 * c) = make_float2(dka[n][2], dka[n][3]);
      *reinterpret_cast<float2*>(dvo + n * 8 + 2 * c) = make_float2(dva[n][2], dva[n][3]);
    }
  }
}

template <int D, bool kDrop>
__global__ void __launch_bounds__(kThreads, kMinBlocks<D>)
    dq_tc_k(const float* __restrict__ dout, const float* __restrict__ q, const float* __restrict__ k,
            const float* __restrict__ v, const float* __restrict__ lse, const float* __restrict__ delta,
            float* __restrict__ dq, int64_t Sq, int64_t Sk, int64_t off, int64_t B, int64_t Nq, int64_t Nkv,
            float scale, int accumulate, const __grid_constant__ DropoutParams drop) {
  unsigned char* smem = dyn_smem();
  __nv_bfloat16* Qs = reinterpret_cast<__nv_bfloat16*>(smem);
  __nv_bfloat16* dOs = Qs + kQRows * kStride<D>;
  __nv_bfloat16* Ks = dOs + kQRows * kStride<D>;
  __nv_bfloat16* Vs = Ks + kQKeys * kStride<D>;
  uint64_t* keep_s = reinterpret_cast<uint64_t*>(Vs + kQKeys * kStride<D>);  // [kQRows] when kDrop

  const int Sqn = static_cast<int>(Sq), Skn = static_cast<int>(Sk), offn = static_cast<int>(off);
  const int tiles = (Sqn + kQRows - 1) / kQRows;
  const int tile = tiles - 1 - static_cast<int>(blockIdx.y);  // longest rows first
  const int64_t bh = blockIdx.x, b = bh / Nq, h = bh % Nq, hk = h / (Nq / Nkv);
  const int i0 = tile * kQRows;
  const int64_t q_stride = B * Nq * D, kv_stride = B * Nkv * D;
  const float* kh = k + (b * Nkv + hk) * D;
  const float* vh = v + (b * Nkv + hk) * D;
  const HeadMask hm = kDrop ? HeadMask(drop, b, h) : HeadMask{};
  load_tiles<D, kQRows>(Qs, q + bh * D, scale, dOs, dout + bh * D, 1.0f, i0, Sq, q_stride);

  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  const int row_lo = i0 + warp * 16, row0 = row_lo + g, row1 = row0 + 8;
  // This lane's rows' lse (log2 units) and Δ; rows past S: P = 0.
  const float lse2_0 = row0 < Sq ? lse[bh * Sq + row0] * kLog2e : INFINITY;
  const float lse2_1 = row1 < Sq ? lse[bh * Sq + row1] * kLog2e : INFINITY;
  const float dl0 = row0 < Sq ? delta[bh * Sq + row0] : 0.0f, dl1 = row1 < Sq ? delta[bh * Sq + row1] : 0.0f;

  float acc[D / 8][4] = {};
  const int last = (i0 + kQRows < Sqn ? i0 + kQRows : Sqn) + offn;  // past the last row's last visible key
  const int kend = last < Skn ? last : Skn;
  for (int j0 = 0; j0 < kend; j0 += kQKeys) {
    __syncthreads();  // the previous K/V tile is consumed
    load_tiles<D, kQKeys>(Ks, kh, 1.0f, Vs, vh, 1.0f, j0, Sk, kv_stride);
    if constexpr (kDrop) tile_keep_bits<kQRows, kThreads>(keep_s, drop, hm, i0, j0);
    __syncthreads();

    float s[kQKeys / 8][4] = {}, dp[kQKeys / 8][4] = {};
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) {
      uint32_t qa[4], da[4];
      load_a<D>(qa, Qs, warp * 16, kk * 16);
      load_a<D>(da, dOs, warp * 16, kk * 16);
#pragma unroll
      for (int np = 0; np < kQKeys / 16; np++) {
        uint32_t bf[4];
        load_b_nk<D>(bf, Ks, np * 16, kk * 16);
        mma(s[2 * np], qa, bf[0], bf[1]);
        mma(s[2 * np + 1], qa, bf[2], bf[3]);
        load_b_nk<D>(bf, Vs, np * 16, kk * 16);
        mma(dp[2 * np], da, bf[0], bf[1]);
        mma(dp[2 * np + 1], da, bf[2], bf[3]);
      }
    }
    const bool diag = j0 + kQKeys - 1 > row_lo + offn || j0 + kQKeys > Skn;
    const uint64_t z0 = kDrop ? keep_s[warp * 16 + g] : 0, z1 = kDrop ? keep_s[warp * 16 + g + 8] : 0;
#pragma unroll
    for (int n = 0; n < kQKeys / 8; n++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const int key = j0 + n * 8 + 2 * c + (e & 1), row = e < 2 ? row0 : row1;
        const float p =
            diag && (key > row + offn || key >= Skn) ? 0.0f : exp2f(s[n][e] * kLog2e - (e < 2 ? lse2_0 : lse2_1));
        if constexpr (kDrop) {  // dS = P ⊙ (Z ⊙ dP − Δ)
          const float zf = (((e < 2 ? z0 : z1) >> (key - j0)) & 1u) ? drop.keep : 0.0f;
          dp[n][e] = p * (dp[n][e] * zf - (e < 2 ? dl0 : dl1));
        } else {
          dp[n][e] = p * (dp[n][e] - (e < 2 ? dl0 : dl1));  // dS, rounded to bf16 below
        }
      }
#pragma unroll
    for (int kk = 0; kk < kQKeys / 16; kk++) {
      uint32_t dsa[4];
      c_to_a(dsa, dp[2 * kk], dp[2 * kk + 1]);
#pragma unroll
      for (int np = 0; np < D / 16; np++) {
        uint32_t bf[4];
        load_b_kn<D>(bf, Ks, kk * 16, np * 16);
        mma(acc[2 * np], dsa, bf[0], bf[1]);
        mma(acc[2 * np + 1], dsa, bf[2], bf[3]);
      }
    }
  }

  if (row0 < Sq) {
    float* out = dq + bh * D + row0 * q_stride;
#pragma unroll
    for (int n = 0; n < D / 8; n++) {
      float2* p = reinterpret_cast<float2*>(out + n * 8 + 2 * c);
      const float2 old = accumulate ? *p : make_float2(0.0f, 0.0f);
      *p = accumulate ? make_float2(old.x + acc[n][0] * scale, old.y + acc[n][1] * scale)
                      : make_float2(acc[n][0] * scale, acc[n][1] * scale);
    }
  }
  if (row1 < Sq) {
    float* out = dq + bh * D + row1 * q_stride;
#pragma unroll
    for (int n = 0; n < D / 8; n++) {
      float2* p = reinterpret_cast<float2*>(out + n * 8 + 2 * c);
      const float2 old = accumulate ? *p : make_float2(0.0f, 0.0f);
      *p = accumulate ? make_float2(old.x + acc[n][2] * scale, old.y + acc[n][3] * scale)
                      : make_float2(acc[n][2] * scale, acc[n][3] * scale);
    }
  }
}

}  // namespace moecore::launch::tc
