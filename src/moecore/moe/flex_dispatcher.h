// Megatron's flex token dispatcher (--moe-token-dispatcher-type flex, DeepEP's and HybridEP's semantics) over an
// expert-parallel group, on moecore's host transport: a token routed to several experts of one rank crosses to that
// rank once, with its routing there (local expert ids and probabilities); the receiver expands it to its experts'
// rows (expert-major, [local expert][source rank], each source's rows in its permutation order: the rows and order
// of the AlltoAll dispatcher), and combine sums a token's prob-weighted expert outputs on that rank (ascending
// expert) before one row per (token, destination rank) returns; the origin sums those in ascending rank order.
// The permutation is fused into the buffers: the send buffer is gathered straight from x_TH, the experts' rows
// straight from the receive buffer. Backward is the exact adjoint of each step. deepep and hybridep select the same
// math here (--moe-flex-dispatcher-backend). Partial sums travel in the row-sum dtype (f32 for bf16 rows).
#pragma once

#include "moecore/moe/token_dispatcher.h"

namespace moecore::moe {

class FlexTokenDispatcher : public ExpertParallelDispatcher {
 public:
  FlexTokenDispatcher(const comm::ProcessGroup& ep, int64_t num_experts)
      : ExpertParallelDispatcher(ep, num_experts, false) {}
  void dispatch(const Tensor& x_TH, const RoutedTokens& routed, DispatchPlan& plan, Tensor& x_RH,
                Tensor& probs_R) override;
  Tensor combine(const Tensor& y_RH, const DispatchPlan& plan) override;
  Tensor combine_backward(const Tensor& dy_TH, const DispatchPlan& plan) override;
  void dispatch_backward(const Tensor& dx_RH, const Tensor& dprobs_R, const DispatchPlan& plan, DType probs_dtype,
                         Tensor& dx_TH, Tensor& dprobs_TK) override;
  // The exchanges of dispatch_backward launched non-blocking (the receiver's per-token sums first), and completed.
  void dispatch_backward_start(const Tensor& dx_RH, const Tensor& dprobs_R, const DispatchPlan& plan,
                               PendingBackward& p) override;
  void dispatch_backward_finish(PendingBackward& p, const DispatchPlan& plan, DType probs_dtype, Tensor& dx_TH,
                                Tensor& dprobs_TK) override;
  // The split forms (token_dispatcher.h) for the combined 1F1B schedule: dispatch_start posts the tokens' exchange
  // and the routing records' (local expert, probability) and returns; dispatch_finish completes the plan from the
  // records.
  void dispatch_start(const Tensor& x_TH, const RoutedTokens& routed, DispatchPlan& plan, Pending& p) override;
  void dispatch_finish(Pending& p, DispatchPlan& plan, Tensor& x_RH, Tensor& probs_R) override;
  void combine_start(const Tensor& y_RH, const DispatchPlan& plan, Pending& p) override;
  Tensor combine_finish(Pending& p, const DispatchPlan& plan) override;
  void combine_backward_start(const Tensor& dy_TH, const DispatchPlan& plan, Pending& p) override;
  Tensor combine_backward_finish(Pending& p, const DispatchPlan& plan) override;

 private:
  // The routing's layout on this rank (sent tokens; each assignment's record [R, record_words], its first two words
  // written: its token's row among the destination's, its local expert) and, after the count exchange, on the
  // receiver (expert rows); x_TH's rows are not touched.
  void plan_exchange(const RoutedTokens& routed, int64_t record_words, DispatchPlan& plan, Tensor& records) const;
  // The receiver's half of the plan (each expert row's received token) from the routing records.
  void complete_plan(const Tensor& records, DispatchPlan& plan) const;
  // Per received token, the sum of its expert rows (ascending), and back at the origin one row per (token, rank).
  Tensor sum_per_received_token(const Tensor& rows_RH, const DispatchPlan& plan) const;
  comm::Work tokens_back_start(const Tensor& per_recv, const DispatchPlan& plan, Tensor& back) const;
  // The received rows expanded to the experts' rows (expert-major, padded layout).
  Tensor expand_rows(const Tensor& recv, const Tensor& rows_of, const DispatchPlan& plan) const;
};

}  // namespace moecore::moe
