// Tensor-level CUDA attention (kernels/attention.h): the GPU attention kernels over a span (launch_attention_tc.h
// AttentionSpan: query rows at q0.., keys at k0.., off = q0 − k0), for the blocks of context parallelism
// (attention_block_forward/backward, with the merge kernel attention_merge.cu) and for the whole sequence, its block
// at positions 0 with dq written rather than added to; the whole sequence's bf16 path goes to cuDNN's fused attention
// first (attention_cudnn.h), which says when it cannot take a call. The dropout keys its mask by global positions as
// the CPU's block form does (its offsets plus q0 and k0), so both devices drop the same probabilities.
#include <algorithm>

#include "moecore/device/gpu_profile.h"
#include "moecore/device/stream.h"
#include "moecore/kernels/backends.h"
#include "moecore/kernels/cuda/attention_cudnn.h"
#include "moecore/kernels/cuda/dropout_params.h"
#include "moecore/kernels/cuda/kernels.h"
#include "moecore/kernels/cuda/launch_attention_tc.h"
#include "moecore/kernels/cuda/tensor_args.h"

namespace moecore::kernels::cuda {

using moecore::device::current_stream;

namespace {
using detail::check_launch;
using detail::f32;

struct BlockShape {
  int64_t Sq, Sk, B, Nq, Nkv, D;
};

// q [Sq, B, Nq, D], k/v [Sk, B, Nkv, D], lse [B, Nq, Sq].
BlockShape block_shape(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& lse) {
  MOE_ASSERT_MSG(q.ndim() == 4 && k.ndim() == 4, "attention block wants [S, B, N, D], got q {} k {}", q.shape().str(),
                 k.shape().str());
  const BlockShape s{q.dim(0), k.dim(0), q.dim(1), q.dim(2), k.dim(2), q.dim(3)};
  MOE_ASSERT_SHAPE(k, {s.Sk, s.B, s.Nkv, s.D});
  MOE_ASSERT(v.shape() == k.shape());
  MOE_ASSERT_MSG(s.Nkv > 0 && s.Nq % s.Nkv == 0, "query heads {} not a multiple of kv heads {}", s.Nq, s.Nkv);
  MOE_ASSERT_SHAPE(lse, {s.B, s.Nq, s.Sq});
  MOE_CHECK(s.D <= 256, "attention on the GPU supports head dims up to 256, got {}", s.D);
  // The kernels index positions within a call in int.
  MOE_ASSERT_MSG(s.Sq < (int64_t{1} << 30) && s.Sk < (int64_t{1} << 30), "attention block of {} x {} rows", s.Sq, s.Sk);
  return s;
}

launch::AttentionSpan span_of(const BlockShape& s, int64_t q0, int64_t k0, bool accumulate_dq) {
  MOE_ASSERT(q0 >= 0 && k0 >= 0 && q0 < (int64_t{1} << 30) && k0 < (int64_t{1} << 30));
  return launch::AttentionSpan{s.Sq, s.Sk, q0 - k0, accumulate_dq ? 1 : 0};
}

// The block's dropout: the caller's mask with q0 and k0 added to its global positions (the CPU block form's
// `shifted`); off when null or off.
launch::DropoutParams block_dropout(const AttentionDropout* d, int64_t B, int64_t q0, int64_t k0) {
  if (!d || !d->on()) return {};
  AttentionDropout shifted = *d;
  shifted.seq_offset = d->seq_offset + q0;
  shifted.key_offset = (d->key_offset < 0 ? d->seq_offset : d->key_offset) + k0;
  return detail::attention_dropout_params(&shifted, B);
}
}  // namespace

void attention_block_forward(const Tensor& q, const Tensor& k, const Tensor& v, int64_t q0, int64_t k0, double scale,
                             Tensor& o, Tensor& lse, const AttentionDropout* dropout, bool round_bf16) {
  const moecore::device::PhaseScope phase(moecore::device::Phase::kAttention);
  const BlockShape s = block_shape(q, k, v, lse);
  MOE_ASSERT(o.shape() == q.shape());
  const launch::DropoutParams drop = block_dropout(dropout, s.B, q0, k0);
  launch::attention_span_forward(f32(q, "q"), f32(k, "k"), f32(v, "v"), f32(o, "o"), f32(lse, "lse"),
                                 span_of(s, q0, k0, false), s.B, s.Nq, s.Nkv, s.D, static_cast<float>(scale),
                                 round_bf16, drop, current_stream());
  check_launch("attention_forward");
}

void attention_merge(Tensor& o, Tensor& lse, const Tensor& o_part, const Tensor& lse_part) {
  const moecore::device::PhaseScope phase(moecore::device::Phase::kAttention);
  MOE_ASSERT(o.ndim() == 4 && o.shape() == o_part.shape() && lse.shape() == lse_part.shape());
  const int64_t S = o.dim(0), BN = o.dim(1) * o.dim(2), D = o.dim(3);
  MOE_ASSERT_SHAPE(lse, {o.dim(1), o.dim(2), S});
  launch::attention_merge(f32(o, "o"), f32(lse, "lse"), f32(o_part, "o_part"), f32(lse_part, "lse_part"), S, BN, D,
                          current_stream());
  check_launch("attention_merge");
}

namespace {
// dq added to (context parallelism's blocks) or written (the whole sequence).
void span_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                   const Tensor& lse, int64_t q0, int64_t k0, double scale, Tensor& dq, Tensor& dk, Tensor& dv,
                   const AttentionDropout* dropout, bool round_bf16, bool accumulate_dq) {
  const moecore::device::PhaseScope phase(moecore::device::Phase::kAttention);
  const BlockShape s = block_shape(q, k, v, lse);
  MOE_ASSERT(dout.shape() == q.shape() && o.shape() == q.shape() && dq.shape() == q.shape());
  MOE_ASSERT(dk.shape() == k.shape() && dv.shape() == v.shape());
  const launch::DropoutParams drop = block_dropout(dropout, s.B, q0, k0);
  Tensor delta = Tensor::empty(lse.shape(), DType::F32, q.device());
  // The tensor-core backward's partial dK/dV when it splits a GQA group's heads over blocks (launch_attention_tc.h).
  const int64_t part = launch::attention_tc_supported(std::max(s.Sq, s.Sk), s.B, s.Nq, s.D, round_bf16)
                           ? launch::attention_tc_dkv_part_floats(s.Sk, s.B, s.Nq, s.Nkv, s.D)
                           : 0;
  Tensor dkv_part = part > 0 ? Tensor::empty({part}, DType::F32, q.device()) : Tensor();
  launch::attention_span_backward(f32(dout, "dout"), f32(q, "q"), f32(k, "k"), f32(v, "v"), f32(o, "o"),
                                  f32(lse, "lse"), f32(dq, "dq"), f32(dk, "dk"), f32(dv, "dv"),
                                  delta.device_data<float>(), part > 0 ? dkv_part.device_data<float>() : nullptr,
                                  span_of(s, q0, k0, accumulate_dq), s.B, s.Nq, s.Nkv, s.D, static_cast<float>(scale),
                                  round_bf16, drop, current_stream());
  check_launch("attention_backward");
}

void require_no_rope(const AttentionRope* rope) {
  MOE_ASSERT_MSG(!rope, "only the CPU's FlashNative bf16 attention kernel applies RoPE itself");
}
}  // namespace

void attention_block_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                              const Tensor& lse, int64_t q0, int64_t k0, double scale, Tensor& dq, Tensor& dk,
                              Tensor& dv, const AttentionDropout* dropout, bool round_bf16) {
  span_backward(dout, q, k, v, o, lse, q0, k0, scale, dq, dk, dv, dropout, round_bf16, true);
}

// The whole sequence (q, k and v of the same rows): the block at positions 0, dq written.
void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, double scale, Tensor& o, Tensor& lse,
                       const AttentionDropout* dropout) {
  cuda::attention_block_forward(q, k, v, 0, 0, scale, o, lse, dropout, false);
}
void attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                        const Tensor& lse, double scale, Tensor& dq, Tensor& dk, Tensor& dv,
                        const AttentionDropout* dropout) {
  span_backward(dout, q, k, v, o, lse, 0, 0, scale, dq, dk, dv, dropout, false, false);
}
void attention_forward_bf16(const Tensor& q, const Tensor& k, const Tensor& v, double scale, Tensor& o, Tensor& lse,
                            const AttentionDropout* dropout, const AttentionRope* rope, int64_t value_dim) {
  require_no_rope(rope);
  if (cudnn_attention_forward(q, k, v, value_dim > 0 ? value_dim : q.dim(3), scale, o, lse, dropout)) return;
  cuda::attention_block_forward(q, k, v, 0, 0, scale, o, lse, dropout, true);
}
void attention_backward_bf16(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                             const Tensor& lse, double scale, Tensor& dq, Tensor& dk, Tensor& dv,
                             const AttentionDropout* dropout, const AttentionRope* rope, int64_t value_dim) {
  require_no_rope(rope);
  if (cudnn_attention_backward(dout, q, k, v, o, lse, value_dim > 0 ? value_dim : q.dim(3), scale, dq, dk, dv, dropout))
    return;
  span_backward(dout, q, k, v, o, lse, 0, 0, scale, dq, dk, dv, dropout, true, false);
}

const AttentionKernels kAttentionKernels{attention_forward,       attention_backward,      attention_forward_bf16,
                                         attention_backward_bf16, attention_block_forward, attention_merge,
                                         attention_block_backward};

}  // namespace moecore::kernels::cuda
