// Causal GQA attention, FlashAttention-2 style (see launch.h). One warp owns one query row (forward, dQ) or one
// key row (dK, dV); lane l holds channels l, l+32, ... (D ≤ 256: 8 per lane). The forward keeps a running max and
// sum (online softmax) and writes lse; the backward recomputes P = exp(scale·q·k − lse). No atomics: every output
// row has exactly one writer, which walks its partners in a fixed order, so reruns give the same bits.
// These are the correctness-first kernels (K/V rows stream from L2, no tensor cores): the f32 path and the fallback
// of the bf16 path; the bf16 path with D ∈ {64, 128} runs the tiled tensor-core kernels (attention_tc*.cu), chosen
// by attention_forward / attention_backward at the end of this file. Attention dropout (drop.on): Z regenerated per
// (row, key) from the CPU's Philox coordinates (attention_dropout.cuh); O sums (P ⊙ Z)·V while the softmax sum takes
// the undropped P, and backward has dV = (P ⊙ Z)ᵀ·dO, dS = P ⊙ (Z ⊙ dP − Δ), as the CPU kernels.
// Spans (launch_attention_tc.h): Sq query rows against Sk keys, key j visible to row i when j ≤ i + off; a row that
// sees no key gets o 0 and lse −inf. The whole sequence ({S, S, 0}) walks exactly the keys it always walked.
#include <algorithm>
#include <initializer_list>

#include "moecore/kernels/cuda/attention_dropout.cuh"
#include "moecore/kernels/cuda/common.cuh"
#include "moecore/kernels/cuda/launch.h"
#include "moecore/kernels/cuda/launch_attention_tc.h"

namespace moecore::launch {

namespace {
constexpr int kMaxPer = 8;    // channels per lane: D ≤ 256
constexpr int kRowWarps = 4;  // rows per block

struct Dims {
  int64_t Sq, Sk, off, B, Nq, Nkv, D;
  int acc_dq;
  // Keys 0 .. key_end(i) − 1 are visible to query row i; query rows query_begin(j) .. Sq − 1 see key j.
  __device__ int64_t key_end(int64_t i) const {
    const int64_t e = i + off + 1 < Sk ? i + off + 1 : Sk;
    return e > 0 ? e : 0;
  }
  __device__ int64_t query_begin(int64_t j) const { return j - off > 0 ? j - off : 0; }
  __device__ int64_t qoff(int64_t s, int64_t b, int64_t h) const { return ((s * B + b) * Nq + h) * D; }
  __device__ int64_t kvoff(int64_t s, int64_t b, int64_t h) const { return ((s * B + b) * Nkv + h) * D; }
};

// Element d of a row times mul, rounded to bf16 when rnd (the CPU bf16 kernel rounds scale·q, k, v, dO).
__device__ __forceinline__ float elem(const float* p, int64_t d, bool rnd, float mul = 1.0f) {
  const float x = p[d] * mul;
  return rnd ? round_bf16(x) : x;
}

__device__ __forceinline__ void load_row(const float* p, int64_t D, bool rnd, float (&r)[kMaxPer], float mul = 1.0f) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int c = 0; c < kMaxPer; c++) {
    const int64_t d = lane + 32 * c;
    r[c] = d < D ? elem(p, d, rnd, mul) : 0.0f;
  }
}

__device__ __forceinline__ float dot_row(const float (&a)[kMaxPer], const float* p, int64_t D, bool rnd,
                                         float mul = 1.0f) {
  const int lane = threadIdx.x & 31;
  float s = 0;
#pragma unroll
  for (int c = 0; c < kMaxPer; c++) {
    const int64_t d = lane + 32 * c;
    if (d < D) s += a[c] * elem(p, d, rnd, mul);
  }
  return warp_sum(s);
}

// Row (b, h, i) per warp; rows are numbered ((b·Nq + h)·S + i), the lse layout.
__global__ void fwd_k(const float* q, const float* k, const float* v, float* o, float* lse, Dims dm, float scale,
                      bool rnd, const __grid_constant__ DropoutParams dp) {
  const int64_t row = blockIdx.x * int64_t(kRowWarps) + threadIdx.x / 32;
  if (row >= dm.B * dm.Nq * dm.Sq) return;
  const int64_t i = row % dm.Sq, bh = row / dm.Sq, h = bh % dm.Nq, b = bh / dm.Nq, hk = h / (dm.Nq / dm.Nkv);
  const int lane = threadIdx.x & 31;
  // bf16: q̂ = bf16(scale·q) carries the scale, as on the CPU; f32: the scores are scaled.
  const float qmul = rnd ? scale : 1.0f, smul = rnd ? 1.0f : scale;
  float qr[kMaxPer], acc[kMaxPer] = {};
  load_row(q + dm.qoff(i, b, h), dm.D, rnd, qr, qmul);
  float mx = -INFINITY, sum = 0;
  RowMask z{dp.on ? HeadMask(dp, b, h) : HeadMask{}, static_cast<uint64_t>(dp.row_offset + i),
            static_cast<uint64_t>(dp.col_offset)};
  const int64_t jend = dm.key_end(i);
  for (int64_t j = 0; j < jend; j++) {
    const float s = dot_row(qr, k + dm.kvoff(j, b, hk), dm.D, rnd) * smul;
    const float nm = fmaxf(mx, s);
    const float corr = expf(mx - nm), pu = expf(s - nm);
    sum = sum * corr + pu;
    const float p = dp.on ? pu * (z.kept(j) ? dp.keep : 0.0f) : pu;  // P ⊙ Z weighs the values
    const float pv = rnd ? round_bf16(p) : p;
    const float* vr = v + dm.kvoff(j, b, hk);
#pragma unroll
    for (int c = 0; c < kMaxPer; c++) {
      const int64_t d = lane + 32 * c;
      acc[c] = acc[c] * corr + (d < dm.D ? pv * elem(vr, d, rnd) : 0.0f);
    }
    mx = nm;
  }
  float* orow = o + dm.qoff(i, b, h);
  const bool seen = jend > 0;  // a row that sees no key: o 0, lse −inf (the merge ignores it)
#pragma unroll
  for (int c = 0; c < kMaxPer; c++) {
    const int64_t d = lane + 32 * c;
    if (d < dm.D) orow[d] = seen ? acc[c] / sum : 0.0f;
  }
  if (lane == 0) lse[row] = seen ? mx + logf(sum) : -INFINITY;
}

// delta[row] = Σ_d dO·O (the softmax backward's row term).
__global__ void delta_k(const float* dout, const float* o, float* delta, Dims dm) {
  const int64_t row = blockIdx.x * int64_t(kRowWarps) + threadIdx.x / 32;
  if (row >= dm.B * dm.Nq * dm.Sq) return;
  const int64_t i = row % dm.Sq, bh = row / dm.Sq, h = bh % dm.Nq, b = bh / dm.Nq;
  float r[kMaxPer];
  load_row(dout + dm.qoff(i, b, h), dm.D, false, r);
  const float d = dot_row(r, o + dm.qoff(i, b, h), dm.D, false);
  if ((threadIdx.x & 31) == 0) delta[row] = d;
}

__global__ void dq_k(const float* dout, const float* q, const float* k, const float* v, const float* lse,
                     const float* delta, float* dq, Dims dm, float scale, bool rnd,
                     const __grid_constant__ DropoutParams dp) {
  const int64_t row = blockIdx.x * int64_t(kRowWarps) + threadIdx.x / 32;
  if (row >= dm.B * dm.Nq * dm.Sq) return;
  const int64_t i = row % dm.Sq, bh = row / dm.Sq, h = bh % dm.Nq, b = bh / dm.Nq, hk = h / (dm.Nq / dm.Nkv);
  const int lane = threadIdx.x & 31;
  const float qmul = rnd ? scale : 1.0f, smul = rnd ? 1.0f : scale;
  float qr[kMaxPer], dor[kMaxPer], acc[kMaxPer] = {};
  load_row(q + dm.qoff(i, b, h), dm.D, rnd, qr, qmul);
  load_row(dout + dm.qoff(i, b, h), dm.D, rnd, dor);
  const float l = lse[row], dl = delta[row];
  RowMask z{dp.on ? HeadMask(dp, b, h) : HeadMask{}, static_cast<uint64_t>(dp.row_offset + i),
            static_cast<uint64_t>(dp.col_offset)};
  const int64_t jend = dm.key_end(i);
  for (int64_t j = 0; j < jend; j++) {
    const float* kr = k + dm.kvoff(j, b, hk);
    const float p = expf(dot_row(qr, kr, dm.D, rnd) * smul - l);
    float g = dot_row(dor, v + dm.kvoff(j, b, hk), dm.D, rnd);
    if (dp.on) g *= z.kept(j) ? dp.keep : 0.0f;  // Z ⊙ dP
    float ds = p * (g - dl);
    if (rnd) ds = round_bf16(ds);
#pragma unroll
    for (int c = 0; c < kMaxPer; c++) {
      const int64_t d = lane + 32 * c;
      if (d < dm.D) acc[c] += ds * elem(kr, d, rnd);
    }
  }
  float* out = dq + dm.qoff(i, b, h);
#pragma unroll
  for (int c = 0; c < kMaxPer; c++) {
    const int64_t d = lane + 32 * c;
    if (d < dm.D) out[d] = dm.acc_dq ? out[d] + acc[c] * scale : acc[c] * scale;
  }
}

// Key row (b, hk, j) per warp: walks the group's query heads, then the rows that see it (i ≥ j − off), in order.
__global__ void dkv_k(const float* dout, const float* q, const float* k, const float* v, const float* lse,
                      const float* delta, float* dk, float* dv, Dims dm, float scale, bool rnd,
                      const __grid_constant__ DropoutParams dp) {
  const int64_t row = blockIdx.x * int64_t(kRowWarps) + threadIdx.x / 32;
  if (row >= dm.B * dm.Nkv * dm.Sk) return;
  const int64_t j = row % dm.Sk, bh = row / dm.Sk, hk = bh % dm.Nkv, b = bh / dm.Nkv, group = dm.Nq / dm.Nkv;
  const int lane = threadIdx.x & 31;
  const float qmul = rnd ? scale : 1.0f, smul = rnd ? 1.0f : scale;  // bf16: q̂ = bf16(scale·q), as on the CPU
  float kr[kMaxPer], vr[kMaxPer], dka[kMaxPer] = {}, dva[kMaxPer] = {};
  load_row(k + dm.kvoff(j, b, hk), dm.D, rnd, kr);
  load_row(v + dm.kvoff(j, b, hk), dm.D, rnd, vr);
  const uint64_t key_col = static_cast<uint64_t>(dp.col_offset + j);
  for (int64_t g = 0; g < group; g++) {
    const int64_t h = hk * group + g, base = (b * dm.Nq + h) * dm.Sq;
    const HeadMask hm = dp.on ? HeadMask(dp, b, h) : HeadMask{};
    for (int64_t i = dm.query_begin(j); i < dm.Sq; i++) {
      const float* qr = q + dm.qoff(i, b, h);
      const float* dor = dout + dm.qoff(i, b, h);
      const float p = expf(dot_row(kr, qr, dm.D, rnd, qmul) * smul - lse[base + i]);
      float g_dp = dot_row(vr, dor, dm.D, rnd);
      float pz = p;  // P ⊙ Z, what weighed the values
      if (dp.on) {
        const float zf = hm.kept(static_cast<uint64_t>(dp.row_offset + i), key_col) ? dp.keep : 0.0f;
        pz = p * zf;
        g_dp *= zf;
      }
      float ds = p * (g_dp - delta[base + i]);
      const float pv = rnd ? round_bf16(pz) : pz;
      if (rnd) ds = round_bf16(ds);
#pragma unroll
      for (int c = 0; c < kMaxPer; c++) {
        const int64_t d = lane + 32 * c;
        if (d < dm.D) {
          dva[c] += pv * elem(dor, d, rnd);
          dka[c] += ds * elem(qr, d, rnd, qmul);
        }
      }
    }
  }
  float* dko = dk + dm.kvoff(j, b, hk);
  float* dvo = dv + dm.kvoff(j, b, hk);
#pragma unroll
  for (int c = 0; c < kMaxPer; c++) {
    const int64_t d = lane + 32 * c;
    if (d < dm.D) {
      dko[d] = dka[c] * smul;
      dvo[d] = dva[c];
    }
  }
}

unsigned blocks_for(int64_t rows) {
  return static_cast<unsigned>((rows + kRowWarps - 1) / kRowWarps);
}
}  // namespace

void attention_delta(const float* dout, const float* o, float* delta, int64_t S, int64_t B, int64_t Nq, int64_t D,
                     cudaStream_t s) {
  const Dims dm{S, S, 0, B, Nq, Nq, D, 0};
  const int64_t rows = B * Nq * S;
  if (rows > 0) delta_k<<<blocks_for(rows), 32 * kRowWarps, 0, s>>>(dout, o, delta, dm);
}

void attention_rowwise_forward(const float* q, const float* k, const float* v, float* o, float* lse,
                               const AttentionSpan& sp, int64_t B, int64_t Nq, int64_t Nkv, int64_t D, float scale,
                               bool round_bf16, const DropoutParams& drop, cudaStream_t s) {
  const Dims dm{sp.Sq, sp.Sk, sp.off, B, Nq, Nkv, D, sp.accumulate_dq};
  const int64_t rows = B * Nq * sp.Sq;
  if (rows > 0) fwd_k<<<blocks_for(rows), 32 * kRowWarps, 0, s>>>(q, k, v, o, lse, dm, scale, round_bf16, drop);
}

void attention_rowwise_forward(const float* q, const float* k, const float* v, float* o, float* lse, int64_t S,
                               int64_t B, int64_t Nq, int64_t Nkv, int64_t D, float scale, bool round_bf16,
                               const DropoutParams& drop, cudaStream_t s) {
  attention_rowwise_forward(q, k, v, o, lse, causal_span(S), B, Nq, Nkv, D, scale, round_bf16, drop, s);
}

void attention_rowwise_backward(const float* dout, const float* q, const float* k, const float* v, const float* o,
                                const float* lse, float* dq, float* dk, float* dv, float* delta,
                                const AttentionSpan& sp, int64_t B, int64_t Nq, int64_t Nkv, int64_t D, float scale,
                                bool round_bf16, const DropoutParams& drop, cudaStream_t s) {
  const Dims dm{sp.Sq, sp.Sk, sp.off, B, Nq, Nkv, D, sp.accumulate_dq};
  const int64_t rows = B * Nq * sp.Sq, kv_rows = B * Nkv * sp.Sk;
  if (rows == 0 || kv_rows == 0) return;
  delta_k<<<blocks_for(rows), 32 * kRowWarps, 0, s>>>(dout, o, delta, dm);
  dq_k<<<blocks_for(rows), 32 * kRowWarps, 0, s>>>(dout, q, k, v, lse, delta, dq, dm, scale, round_bf16, drop);
  dkv_k<<<blocks_for(kv_rows), 32 * kRowWarps, 0, s>>>(dout, q, k, v, lse, delta, dk, dv, dm, scale, round_bf16, drop);
}

void attention_rowwise_backward(const float* dout, const float* q, const float* k, const float* v, const float* o,
                                const float* lse, float* dq, float* dk, float* dv, float* delta, int64_t S, int64_t B,
                                int64_t Nq, int64_t Nkv, int64_t D, float scale, bool round_bf16,
                                const DropoutParams& drop, cudaStream_t s) {
  attention_rowwise_backward(dout, q, k, v, o, lse, dq, dk, dv, delta, causal_span(S), B, Nq, Nkv, D, scale, round_bf16,
                             drop, s);
}

namespace {
// The tensor-core kernels move float4 (loads) and float2 (stores) per lane.
bool aligned16(std::initializer_list<const void*> ps) {
  for (const void* p : ps)
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  return true;
}
}  // namespace

void attention_span_forward(const float* q, const float* k, const float* v, float* o, float* lse,
                            const AttentionSpan& sp, int64_t B, int64_t Nq, int64_t Nkv, int64_t D, float scale,
                            bool round_bf16, const DropoutParams& drop, cudaStream_t s) {
  if (B * Nq * sp.Sq == 0) return;
  if (attention_tc_supported(std::max(sp.Sq, sp.Sk), B, Nq, D, round_bf16) && aligned16({q, k, v, o}))
    attention_tc_forward(q, k, v, o, lse, sp, B, Nq, Nkv, D, scale, drop, s);
  else
    attention_rowwise_forward(q, k, v, o, lse, sp, B, Nq, Nkv, D, scale, round_bf16, drop, s);
}

void attention_span_backward(const float* dout, const float* q, const float* k, const float* v, const float* o,
                             const float* lse, float* dq, float* dk, float* dv, float* delta, float* dkv_scratch,
                             const AttentionSpan& sp, int64_t B, int64_t Nq, int64_t Nkv, int64_t D, float scale,
                             bool round_bf16, const DropoutParams& drop, cudaStream_t s) {
  if (B * Nq * sp.Sq == 0 || sp.Sk == 0) return;
  if (attention_tc_supported(std::max(sp.Sq, sp.Sk), B, Nq, D, round_bf16) && aligned16({dout, q, k, v, dq, dk, dv})) {
    attention_delta(dout, o, delta, sp.Sq, B, Nq, D, s);
    attention_tc_backward(dout, q, k, v, lse, delta, dq, dk, dv, dkv_scratch, sp, B, Nq, Nkv, D, scale, drop, s);
  } else {
    attention_rowwise_backward(dout, q, k, v, o, lse, dq, dk, dv, delta, sp, B, Nq, Nkv, D, scale, round_bf16, drop, s);
  }
}

void attention_forward(const float* q, const float* k, const float* v, float* o, float* lse, int64_t S, int64_t B,
                       int64_t Nq, int64_t Nkv, int64_t D, float scale, bool round_bf16, const DropoutParams& drop,
                       cudaStream_t s) {
  attention_span_forward(q, k, v, o, lse, causal_span(S), B, Nq, Nkv, D, scale, round_bf16, drop, s);
}

void attention_backward(const float* dout, const float* q, const float* k, const float* v, const float* o,
                        const float* lse, float* dq, float* dk, float* dv, float* delta, float* dkv_scratch, int64_t S,
                        int64_t B, int64_t Nq, int64_t Nkv, int64_t D, float scale, bool round_bf16,
                        const DropoutParams& drop, cudaStream_t s) {
  attention_span_backward(dout, q, k, v, o, lse, dq, dk, dv, delta, dkv_scratch, causal_span(S), B, Nq, Nkv, D, scale,
                          round_bf16, drop, s);
}

}  // namespace moecore::launch
