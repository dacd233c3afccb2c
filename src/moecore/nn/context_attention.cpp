// Attention over context parallelism: the dispatch on --cp-comm-type (see context_attention.h). Each communication
// pattern is its own file: context_attention_p2p.cpp (the K/V ring), context_attention_a2a.cpp (Ulysses),
// context_attention_allgather.cpp, context_attention_a2a_p2p.cpp (hierarchical); the block kernel they share is
// kernels::attention_block_forward/backward (either device's backend, routed by kernels/dispatch.cpp).
#include "moecore/nn/context_attention.h"

#include "moecore/comm/process_group.h"
#include "moecore/nn/context_attention_parts.h"

namespace moecore::nn {

namespace {

void check_rows(const Tensor& q, const ContextParallel& cp) {
  MOE_ASSERT_MSG(cp.group && cp.group->size() == cp.size && cp.group->rank() == cp.rank,
                 "context parallel group does not match size {} rank {}", cp.size, cp.rank);
  MOE_ASSERT_MSG(q.ndim() == 4 && q.dim(0) % 2 == 0, "context attention wants 2·Sc rows, got {}", q.shape().str());
}

}  // namespace

void context_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, double scale,
                               const ContextParallel& cp, Tensor& o, Tensor& lse,
                               const kernels::AttentionDropout* dropout) {
  if (dropout && !dropout->on()) dropout = nullptr;
  if (!cp.on()) {
    if (cp.bf16)
      kernels::attention_forward_bf16(q, k, v, scale, o, lse, dropout);
    else
      kernels::attention_forward(q, k, v, scale, o, lse, dropout);
    return;
  }
  check_rows(q, cp);
  switch (cp.comm_type) {
    case CpCommType::P2P:
      return cp_parts::p2p_forward(q, k, v, scale, cp, o, lse, dropout);
    case CpCommType::A2A:
      return cp_parts::a2a_forward(q, k, v, scale, cp, o, lse, dropout);
    case CpCommType::AllGather:
      return cp_parts::allgather_forward(q, k, v, scale, cp, o, lse, dropout);
    case CpCommType::A2AP2P:
      return cp_parts::a2a_p2p_forward(q, k, v, scale, cp, o, lse, dropout);
  }
}

void context_attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                                const Tensor& lse, double scale, const ContextParallel& cp, Tensor& dq, Tensor& dk,
                                Tensor& dv, const kernels::AttentionDropout* dropout) {
  if (dropout && !dropout->on()) dropout = nullptr;
  if (!cp.on()) {
    if (cp.bf16)
      kernels::attention_backward_bf16(dout, q, k, v, o, lse, scale, dq, dk, dv, dropout);
    else
      kernels::attention_backward(dout, q, k, v, o, lse, scale, dq, dk, dv, dropout);
    return;
  }
  check_rows(q, cp);
  switch (cp.comm_type) {
    case CpCommType::P2P:
      return cp_parts::p2p_backward(dout, q, k, v, o, lse, scale, cp, dq, dk, dv, dropout);
    case CpCommType::A2A:
      return cp_parts::a2a_backward(dout, q, k, v, o, lse, scale, cp, dq, dk, dv, dropout);
    case CpCommType::AllGather:
      return cp_parts::allgather_backward(dout, q, k, v, o, lse, scale, cp, dq, dk, dv, dropout);
    case CpCommType::A2AP2P:
      return cp_parts::a2a_p2p_backward(dout, q, k, v, o, lse, scale, cp, dq, dk, dv, dropout);
  }
}

}  // namespace moecore::nn
