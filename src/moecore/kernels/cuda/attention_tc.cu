// Launchers of the tensor-core attention forward kernel (attention_tc_fwd.cuh) and the path check
// (launch_attention_tc.h).
#include "moecore/kernels/cuda/attention_tc_fwd.cuh"
#include "moecore/kernels/cuda/launch_attention_tc.h"

namespace moecore::launch {

namespace {
using namespace tc;

template <int D, bool kDrop>
void launch_fwd(const float* q, const float* k, const float* v, float* o, float* lse, const AttentionSpan& sp,
                int64_t B, int64_t Nq, int64_t Nkv, float scale, const DropoutParams& drop, cudaStream_t s) {
  constexpr int smem = fwd_smem_bytes<D, kDrop>();
  // A failure here is recorded as the last error and reported by the caller's launch check.
  cudaFuncSetAttribute(fwd_tc_k<D, kDrop>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  // Heads along x, tiles along y: blocks start in x-fastest order, so every head's longest tile goes first.
  const dim3 grid(static_cast<unsigned>(B * Nq), static_cast<unsigned>((sp.Sq + kBr - 1) / kBr));
  fwd_tc_k<D, kDrop><<<grid, kThreads, smem, s>>>(q, k, v, o, lse, sp.Sq, sp.Sk, sp.off, B, Nq, Nkv, scale, drop);
}
}  // namespace

bool attention_tc_supported(int64_t S, int64_t B, int64_t Nq, int64_t D, bool round_bf16) {
  // grid.x is B·Nq, grid.y the tiles (S/64 ≤ 65535); the kernels index sequence positions (plus a tile) in int.
  return round_bf16 && (D == 64 || D == 128) && S > 0 && S <= int64_t(65535) * 64 && B * Nq <= 0x7fffffff;
}

void attention_tc_forward(const float* q, const float* k, const float* v, float* o, float* lse, const AttentionSpan& sp,
                          int64_t B, int64_t Nq, int64_t Nkv, int64_t D, float scale, const DropoutParams& drop,
                          cudaStream_t s) {
  if (D == 64 && drop.on)
    launch_fwd<64, true>(q, k, v, o, lse, sp, B, Nq, Nkv, scale, drop, s);
  else if (D == 64)
    launch_fwd<64, false>(q, k, v, o, lse, sp, B, Nq, Nkv, scale, drop, s);
  else if (drop.on)
    launch_fwd<128, true>(q, k, v, o, lse, sp, B, Nq, Nkv, scale, drop, s);
  else
    launch_fwd<128, false>(q, k, v, o, lse, sp, B, Nq, Nkv, scale, drop, s);
}

void attention_tc_forward(const float* q, const float* k, const float* v, float* o, float* lse, int64_t S, int64_t B,
                          int64_t Nq, int64_t Nkv, int64_t D, float scale, const DropoutParams& drop, cudaStream_t s) {
  attention_tc_forward(q, k, v, o, lse, causal_span(S), B, Nq, Nkv, D, scale, drop, s);
}

}  // namespace moecore::launch
