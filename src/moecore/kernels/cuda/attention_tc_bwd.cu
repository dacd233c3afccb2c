// Launchers of the tensor-core attention backward kernels (attention_tc_bwd.cuh; launch_attention_tc.h).
#include <algorithm>

#include "moecore/kernels/cuda/attention_tc_bwd.cuh"
#include "moecore/kernels/cuda/launch_attention_tc.h"

namespace moecore::launch {

namespace {
using namespace tc;

// out[i] = Σ_z part[z·n + i], z ascending: the split heads' partial dK or dV in a fixed order.
__global__ void sum_splits_k(const float* __restrict__ part, int64_t n, int splits, float* __restrict__ out) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    float a = part[i];
    for (int z = 1; z < splits; z++) a += part[z * n + i];
    out[i] = a;
  }
}

template <int D, bool kDrop>
void launch_bwd(const float* dout, const float* q, const float* k, const float* v, const float* lse, const float* delta,
                float* dq, float* dk, float* dv, float* dkv_part, const AttentionSpan& sp, int64_t B, int64_t Nq,
                int64_t Nkv, float scale, const DropoutParams& drop, cudaStream_t s) {
  // Failures of the attribute calls are recorded as the last error and reported by the caller's launch check.
  constexpr int dkv_smem = dkv_smem_bytes<D, kDrop>(), dq_smem = dq_smem_bytes<D, kDrop>();
  cudaFuncSetAttribute(dkv_tc_k<D, kDrop>, cudaFuncAttributeMaxDynamicSharedMemorySize, dkv_smem);
  cudaFuncSetAttribute(dq_tc_k<D, kDrop>, cudaFuncAttributeMaxDynamicSharedMemorySize, dq_smem);
  // Heads along x, tiles along y: blocks start in x-fastest order, so the longest tiles of every head go first.
  const int splits = static_cast<int>(attention_tc_dkv_splits(sp.Sk, B, Nq, Nkv));
  const int64_t n = sp.Sk * B * Nkv * D;
  float* dk_out = splits > 1 ? dkv_part : dk;
  float* dv_out = splits > 1 ? dkv_part + splits * n : dv;
  const dim3 kv_grid(static_cast<unsigned>(B * Nkv * splits), static_cast<unsigned>((sp.Sk + kKvRows - 1) / kKvRows));
  dkv_tc_k<D, kDrop><<<kv_grid, kThreads, dkv_smem, s>>>(dout, q, k, v, lse, delta, dk_out, dv_out, sp.Sq, sp.Sk,
                                                         sp.off, B, Nq, Nkv, scale, splits, n, drop);
  if (splits > 1) {
    const unsigned g = static_cast<unsigned>(std::min<int64_t>((n + 255) / 256, 65535LL * 8));
    sum_splits_k<<<g, 256, 0, s>>>(dk_out, n, splits, dk);
    sum_splits_k<<<g, 256, 0, s>>>(dv_out, n, splits, dv);
  }
  const dim3 q_grid(static_cast<unsigned>(B * Nq), static_cast<unsigned>((sp.Sq + kQRows - 1) / kQRows));
  dq_tc_k<D, kDrop><<<q_grid, kThreads, dq_smem, s>>>(dout, q, k, v, lse, delta, dq, sp.Sq, sp.Sk, sp.off, B, Nq, Nkv,
                                                      scale, sp.accumulate_dq, drop);
}
}  // namespace

void attention_tc_backward(const float* dout, const float* q, const float* k, const float* v, const float* lse,
                           const float* delta, float* dq, float* dk, float* dv, float* dkv_part,
                           const AttentionSpan& sp, int64_t B, int64_t Nq, int64_t Nkv, int64_t D, float scale,
                           const DropoutParams& drop, cudaStream_t s) {
  if (D == 64 && drop.on)
    launch_bwd<64, true>(dout, q, k, v, lse, delta, dq, dk, dv, dkv_part, sp, B, Nq, Nkv, scale, drop, s);
  else if (D == 64)
    launch_bwd<64, false>(dout, q, k, v, lse, delta, dq, dk, dv, dkv_part, sp, B, Nq, Nkv, scale, drop, s);
  else if (drop.on)
    launch_bwd<128, true>(dout, q, k, v, lse, delta, dq, dk, dv, dkv_part, sp, B, Nq, Nkv, scale, drop, s);
  else
    launch_bwd<128, false>(dout, q, k, v, lse, delta, dq, dk, dv, dkv_part, sp, B, Nq, Nkv, scale, drop, s);
}

void attention_tc_backward(const float* dout, const float* q, const float* k, const float* v, const float* lse,
                           const float* delta, float* dq, float* dk, float* dv, float* dkv_part, int64_t S, int64_t B,
                           int64_t Nq, int64_t Nkv, int64_t D, float scale, const DropoutParams& drop, cudaStream_t s) {
  attention_tc_backward(dout, q, k, v, lse, delta, dq, dk, dv, dkv_part, causal_span(S), B, Nq, Nkv, D, scale, drop, s);
}

}  // namespace moecore::launch
