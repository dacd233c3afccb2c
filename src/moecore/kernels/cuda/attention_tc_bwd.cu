// Launchers of the tensor-core attention backward kernels (attention_tc_bwd.cuh; launch_attention_tc.h).
#include "moecore/kernels/cuda/attention_tc_bwd.cuh"
#include "moecore/kernels/cuda/launch_attention_tc.h"

namespace moecore::launch {

namespace {
using namespace tc;

template <int D>
void launch_bwd(const float* dout, const float* q, const float* k, const float* v, const float* lse, const float* delta,
                float* dq, float* dk, float* dv, int64_t S, int64_t B, int64_t Nq, int64_t Nkv, float scale,
                cudaStream_t s) {
  // Failures of the attribute calls are recorded as the last error and reported by the caller's launch check.
  constexpr int dkv_smem = dkv_smem_bytes<D>(), dq_smem = dq_smem_bytes<D>();
  cudaFuncSetAttribute(dkv_tc_k<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, dkv_smem);
  cudaFuncSetAttribute(dq_tc_k<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, dq_smem);
  // Heads along x, tiles along y: blocks start in x-fastest order, so the longest tiles of every head go first.
  const dim3 kv_grid(static_cast<unsigned>(B * Nkv), static_cast<unsigned>((S + kKvRows - 1) / kKvRows));
  dkv_tc_k<D><<<kv_grid, kThreads, dkv_smem, s>>>(dout, q, k, v, lse, delta, dk, dv, S, B, Nq, Nkv, scale);
  const dim3 q_grid(static_cast<unsigned>(B * Nq), static_cast<unsigned>((S + kQRows - 1) / kQRows));
  dq_tc_k<D><<<q_grid, kThreads, dq_smem, s>>>(dout, q, k, v, lse, delta, dq, S, B, Nq, Nkv, scale);
}
}  // namespace

void attention_tc_backward(const float* dout, const float* q, const float* k, const float* v, const float* lse,
                           const float* delta, float* dq, float* dk, float* dv, int64_t S, int64_t B, int64_t Nq,
                           int64_t Nkv, int64_t D, float scale, cudaStream_t s) {
  if (D == 64)
    launch_bwd<64>(dout, q, k, v, lse, delta, dq, dk, dv, S, B, Nq, Nkv, scale, s);
  else
    launch_bwd<128>(dout, q, k, v, lse, delta, dq, dk, dv, S, B, Nq, Nkv, scale, s);
}

}  // namespace moecore::launch
