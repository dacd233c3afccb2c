// Causal GQA attention on the CPU: the shape checks, the f32/f64 entry points and the backend's table of entry points
// (see attention.h); the kernels themselves are attention_flash*.cpp and attention_bf16.cpp.
#include "moecore/kernels/attention.h"

#include "moecore/kernels/backends.h"
#include "moecore/kernels/cpu/attention_flash.h"

namespace moecore::kernels {

AttentionDims attention_shapes(const Tensor& q, const Tensor& k, const Tensor& v) {
  MOE_ASSERT_MSG(q.ndim() == 4 && k.ndim() == 4, "attention wants [S, B, N, D], got q {} k {}", q.shape().str(),
                 k.shape().str());
  AttentionDims d{q.dim(0), q.dim(1), q.dim(2), k.dim(2), q.dim(3)};
  MOE_ASSERT_SHAPE(k, {d.S, d.B, d.Nkv, d.D});
  MOE_ASSERT_SHAPE(v, {d.S, d.B, d.Nkv, d.D});
  MOE_ASSERT_MSG(d.Nkv > 0 && d.Nq % d.Nkv == 0, "query heads {} not a multiple of kv heads {}", d.Nq, d.Nkv);
  return d;
}

AttentionDims attention_dims(const Tensor& q, const Tensor& k, const Tensor& v) {
  const AttentionDims d = attention_shapes(q, k, v);
  MOE_ASSERT(q.dtype() == k.dtype() && q.dtype() == v.dtype());
  return d;
}

AttentionDims attention_forward_dims(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                                     const Tensor& lse) {
  const AttentionDims d = attention_dims(q, k, v);
  MOE_ASSERT(o.shape() == q.shape() && o.dtype() == q.dtype() && lse.dtype() == q.dtype());
  MOE_ASSERT_SHAPE(lse, {d.B, d.Nq, d.S});
  return d;
}

AttentionDims attention_backward_dims(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                                      const Tensor& o, const Tensor& lse, const Tensor& dq, const Tensor& dk,
                                      const Tensor& dv) {
  const AttentionDims d = attention_dims(q, k, v);
  MOE_ASSERT(dout.shape() == q.shape() && o.shape() == q.shape() && dq.shape() == q.shape());
  MOE_ASSERT(dk.shape() == k.shape() && dv.shape() == v.shape());
  MOE_ASSERT_SHAPE(lse, {d.B, d.Nq, d.S});
  return d;
}

namespace cpu {
void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, double scale, Tensor& o, Tensor& lse,
                       const AttentionDropout* dropout) {
  flash::forward(q, k, v, scale, o, lse, dropout, /*round_bf16=*/false);
}

void attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                        const Tensor& lse, double scale, Tensor& dq, Tensor& dk, Tensor& dv,
                        const AttentionDropout* dropout) {
  flash::backward(dout, q, k, v, o, lse, scale, dq, dk, dv, dropout, /*round_bf16=*/false);
}

const AttentionKernels kAttentionKernels{attention_forward,       attention_backward,      attention_forward_bf16,
                                         attention_backward_bf16, attention_block_forward, attention_merge,
                                         attention_block_backward};
}  // namespace cpu

}  // namespace moecore::kernels
