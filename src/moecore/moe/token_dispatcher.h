// TokenDispatcher: moves routed rows to their experts and back (Dispatch and Combine of the four MoE stages),
// consuming the router's [T, K] ids and probabilities (routed_tokens.h). The local dispatcher permutes inside one
// process: rows expert-major, ascending token index inside an expert
// (Megatron's permute); combine sums each token's rows in ascending expert order (a fixed order, so results are
// deterministic). Dispatch and combine are each other's adjoint; the plan (the "handle") lives in the stash.
// The allgather and alltoall dispatchers over MPI implement the same interface (distributed issue).
// The steps are written once for both devices: the plan and the row moves are ops of kernels/moe_permute.h, run
// where x_TH and the routing live (on a GPU the plan's host vectors stay on the host, its Tensors live on the GPU),
// with the same rows, order and sums; MPI traffic of the expert-parallel dispatchers is host-staged.
#pragma once

#include <optional>
#include <vector>

#include "moecore/comm/process_group.h"
#include "moecore/core/tensor.h"
#include "moecore/kernels/moe_permute.h"
#include "moecore/moe/routed_tokens.h"

namespace moecore::moe {

// The permutation's plan (kernels::PermutePlan: rows, row_token_R, row_tk_R, the token CSR, tokens_per_expert) and
// what the dispatchers add to it. Under expert parallelism tokens_per_expert ends as [E_local] rows per local
// expert, in row order, and R as the rows this rank's experts receive.
struct DispatchPlan : kernels::PermutePlan {
  // Set by the caller before dispatch: every local expert's rows start at a multiple of row_align; the gap rows
  // after them have no token (row_token_R and row_tk_R −1), are zero, have probability 0 and are never summed into
  // a token. This is the CPU grouped experts' padded layout, written by the permutation itself instead of by a copy
  // in the experts. CPU only (1 on a GPU).
  int64_t row_align = 1;
  // Set by the caller before dispatch: the dtype of the permuted rows, dispatch's and combine_backward's (unset: the
  // input's). The row copies convert as they gather, so the MoE layer's bf16 experts get f32 tokens rounded once per
  // row, with no cast pass over [T, H] before the permutation (the allgather dispatcher still casts before its
  // all-gather, to send bf16).
  std::optional<DType> rows_dtype;
  DType rows_dtype_for(const Tensor& x) const { return rows_dtype.value_or(x.dtype()); }
  int64_t T = 0, E = 0, K = 0;  // E: the experts permuted over (all, or this rank's under allgather)
  // Expert parallelism (empty on one rank): rows sent to / received from each EP rank, and for every row of the
  // expert-major output, its row in the receive buffer.
  std::vector<int64_t> input_splits, output_splits;
  Tensor sorted_from_recv;  // I32 [R]: −1 for a gap row of the padded layout
  int64_t local_rows = 0;   // rows this rank permuted before the exchange
  int64_t recv_rows = 0;    // rows it received
  int64_t T_local = 0;      // AllGather dispatcher: this rank's tokens (T counts the gathered ones)
  // Flex dispatcher (flex_dispatcher.h): input_splits / output_splits, local_rows and recv_rows count (token,
  // expert) assignments, the routing that travels beside the tokens; sorted_from_recv maps every expert row to its
  // row among the received tokens. The tokens themselves travel once per (token, destination rank):
  std::vector<int64_t> send_tokens, recv_tokens;  // token rows sent to / received from each EP rank
  Tensor send_token;                              // I32 [sent]: the token of each sent row (by rank, ascending token)
  Tensor sent_offsets_T1, sent_of_token;          // CSR over tokens: token t's sent rows, in ascending rank order
  Tensor row_assign;                              // I32 [R]: each expert row's received assignment (−1: gap row)
  Tensor recv_offsets, recv_expert_rows;          // CSR over received tokens: their expert rows, ascending
};

class TokenDispatcher {
 public:
  virtual ~TokenDispatcher() = default;
  // x_TH [T, H] and the routing ([T, K] ids and probabilities) -> x_RH [R, H] (plan.rows_dtype) and probs_R [R] (the
  // rows' dtype; f32 for bf16 rows), rows grouped by local expert, each expert's starting at a multiple of
  // plan.row_align.
  virtual void dispatch(const Tensor& x_TH, const RoutedTokens& routed, DispatchPlan& plan, Tensor& x_RH,
                        Tensor& probs_R) = 0;
  // y_RH [R, H] -> y_TH [T, H]: each token's rows summed (in f32 for bf16 rows).
  virtual Tensor combine(const Tensor& y_RH, const DispatchPlan& plan) = 0;
  // Adjoint of combine: dy_TH -> dy_RH (each row gets its token's gradient, in plan.rows_dtype).
  virtual Tensor combine_backward(const Tensor& dy_TH, const DispatchPlan& plan) = 0;
  // Adjoint of dispatch: dx_RH, dprobs_R -> dx_TH (sum over a token's rows), dprobs_TK [T, K] (probs_dtype; 0 for
  // dropped assignments, padding rows' gradients discarded).
  virtual void dispatch_backward(const Tensor& dx_RH, const Tensor& dprobs_R, const DispatchPlan& plan,
                                 DType probs_dtype, Tensor& dx_TH, Tensor& dprobs_TK) = 0;
  // dispatch_backward in two halves, so that work which does not need its result (the delayed expert
  // weight-gradient GEMMs) runs while its exchange is in flight: start launches the exchange (non-blocking where
  // the dispatcher communicates), finish waits for it and completes dx_TH and dprobs_TK. The same rows, sums and
  // bits as dispatch_backward. By default everything runs in finish.
  struct PendingBackward {
    Tensor dx_RH, dprobs_R;       // the inputs (kept for the default finish)
    Tensor dx_local, dp_local;    // the exchange's receive buffers (rows back at their tokens' ranks)
    Tensor dx_send, dp_send;      // its send buffers, alive until it completes
    comm::Work dx_work, dp_work;  // the exchange in flight
    void progress() {             // lets the host transport advance the exchange (completes nothing early)
      dx_work.test();
      dp_work.test();
    }
  };
  virtual void dispatch_backward_start(const Tensor& dx_RH, const Tensor& dprobs_R, const DispatchPlan& plan,
                                       PendingBackward& p);
  virtual void dispatch_backward_finish(PendingBackward& p, const DispatchPlan& plan, DType probs_dtype, Tensor& dx_TH,
                                        Tensor& dprobs_TK);
  // dispatch, combine and combine_backward in two halves likewise, for the combined 1F1B schedule (nn/substeps.h):
  // start computes up to the exchange and posts it (non-blocking where the dispatcher communicates), finish waits
  // and completes (a dispatcher whose plan depends on what the exchange carries completes the plan there). The same
  // rows, sums and bits as the one-call forms; by default start runs the whole operation.
  struct Pending {
    Tensor out_a, out_b;        // the results (the default path), or the receive buffers
    Tensor send_a, send_b;      // send buffers, alive until the exchange completes
    comm::Work work_a, work_b;  // the exchange in flight
    bool in_flight() const { return work_a.pending() || work_b.pending(); }
  };
  virtual void dispatch_start(const Tensor& x_TH, const RoutedTokens& routed, DispatchPlan& plan, Pending& p);
  virtual void dispatch_finish(Pending& p, DispatchPlan& plan, Tensor& x_RH, Tensor& probs_R);
  virtual void combine_start(const Tensor& y_RH, const DispatchPlan& plan, Pending& p);
  virtual Tensor combine_finish(Pending& p, const DispatchPlan& plan);
  virtual void combine_backward_start(const Tensor& dy_TH, const DispatchPlan& plan, Pending& p);
  virtual Tensor combine_backward_finish(Pending& p, const DispatchPlan& plan);
};

class LocalTokenDispatcher : public TokenDispatcher {
 public:
  explicit LocalTokenDispatcher(int64_t num_experts) : E_(num_experts) {}
  void dispatch(const Tensor& x_TH, const RoutedTokens& routed, DispatchPlan& plan, Tensor& x_RH,
                Tensor& probs_R) override;
  // The permutation itself: rows of experts [0, E) (other ids, −1 included, are skipped), each expert's starting
  // at a multiple of row_align; under padding, every block of `block` tokens (one source rank's) gives each expert
  // exactly pad_capacity rows.
  void permute(const Tensor& x_TH, const Tensor& idx_TK, const Tensor& probs_TK, int64_t pad_capacity, int64_t block,
               int64_t row_align, DispatchPlan& plan, Tensor& x_RH, Tensor& probs_R) const;
  Tensor combine(const Tensor& y_RH, const DispatchPlan& plan) override;
  Tensor combine_backward(const Tensor& dy_TH, const DispatchPlan& plan) override;
  void dispatch_backward(const Tensor& dx_RH, const Tensor& dprobs_R, const DispatchPlan& plan, DType probs_dtype,
                         Tensor& dx_TH, Tensor& dprobs_TK) override;

 private:
  int64_t E_;
};

// Rows arriving as chunks [source rank s][local expert e] of count(s, e) = counts[s·stride + offset + e] rows,
// reordered expert-major ([e][s], source order kept), each expert's rows starting at a multiple of row_align: for
// each output row, its row in the arriving buffer (I32; −1 for a gap row). Sets per_expert ([n_local]) to each
// expert's rows.
Tensor expert_major_order(int64_t ranks, int64_t n_local, const int64_t* counts, int64_t stride, int64_t offset,
                          std::vector<int64_t>& per_expert, int64_t row_align = 1);

}  // namespace moecore::moe

namespace moecore::comm {
class ProcessGroup;
}

namespace moecore::moe {

// What both expert-parallel dispatchers share: the group, the expert counts (E divisible by EP, checked once), and
// the local dispatcher that permutes rows on this rank.
class ExpertParallelDispatcher : public TokenDispatcher {
 protected:
  // local_ permutes over all experts, or only this rank's (local_experts_only).
  ExpertParallelDispatcher(const comm::ProcessGroup& ep, int64_t num_experts, bool local_experts_only);
  const comm::ProcessGroup& ep_;
  int64_t E_, n_local_;
  LocalTokenDispatcher local_;
};

// Megatron's AlltoAll dispatcher over an expert-parallel group (reference §3): local permute by global expert,
// all-gather of per-expert counts, all-to-all-v of tokens and probabilities, then chunks reordered from
// [source rank][local expert] to expert-major. Combine and both backward passes are the exact adjoints.
class AllToAllTokenDispatcher : public ExpertParallelDispatcher {
 public:
  AllToAllTokenDispatcher(const comm::ProcessGroup& ep, int64_t num_experts)
      : ExpertParallelDispatcher(ep, num_experts, false) {}
  void dispatch(const Tensor& x_TH, const RoutedTokens& routed, DispatchPlan& plan, Tensor& x_RH,
                Tensor& probs_R) override;
  Tensor combine(const Tensor& y_RH, const DispatchPlan& plan) override;
  Tensor combine_backward(const Tensor& dy_TH, const DispatchPlan& plan) override;
  void dispatch_backward(const Tensor& dx_RH, const Tensor& dprobs_R, const DispatchPlan& plan, DType probs_dtype,
                         Tensor& dx_TH, Tensor& dprobs_TK) override;
  // The all-to-alls of dispatch_backward launched non-blocking, and completed.
  void dispatch_backward_start(const Tensor& dx_RH, const Tensor& dprobs_R, const DispatchPlan& plan,
                               PendingBackward& p) override;
  void dispatch_backward_finish(PendingBackward& p, const DispatchPlan& plan, DType probs_dtype, Tensor& dx_TH,
                                Tensor& dprobs_TK) override;
  void dispatch_start(const Tensor& x_TH, const RoutedTokens& routed, DispatchPlan& plan, Pending& p) override;
  void dispatch_finish(Pending& p, DispatchPlan& plan, Tensor& x_RH, Tensor& probs_R) override;
  void combine_start(const Tensor& y_RH, const DispatchPlan& plan, Pending& p) override;
  Tensor combine_finish(Pending& p, const DispatchPlan& plan) override;
  void combine_backward_start(const Tensor& dy_TH, const DispatchPlan& plan, Pending& p) override;
  Tensor combine_backward_finish(Pending& p, const DispatchPlan& plan) override;

 private:
  // local permuted rows -> received rows in expert-major order, and back (exchange_backward_start: the same,
  // non-blocking: `send` and `local` must stay alive until `work` completes; exchange_forward_start likewise, and
  // sort_received puts what arrived in expert-major order)
  Tensor exchange_forward(const Tensor& local_rows, const DispatchPlan& plan) const;
  comm::Work exchange_forward_start(const Tensor& local_rows, const DispatchPlan& plan, Tensor& send,
                                    Tensor& recv) const;
  Tensor sort_received(const Tensor& recv, const DispatchPlan& plan) const;
  // dispatch up to the exchange: the permuted rows and probabilities, and the plan
  void dispatch_plan(const Tensor& x_TH, const RoutedTokens& routed, DispatchPlan& plan, Tensor& x_perm,
                     Tensor& p_perm);
  Tensor exchange_backward(const Tensor& sorted_rows, const DispatchPlan& plan) const;
  comm::Work exchange_backward_start(const Tensor& sorted_rows, const DispatchPlan& plan, Tensor& send,
                                     Tensor& local) const;
};

}  // namespace moecore::moe

namespace moecore::moe {

// Megatron's AllGather dispatcher over an expert-parallel group (with ETP = 1): tokens and the [T, K] ids and
// probabilities are all-gathered (Megatron gathers the dense [T, E] map and probabilities), each rank permutes the rows
// of its own experts, and combine reduce-scatters the expert outputs back to the tokens' ranks. Backward all-gathers
// output gradients and reduce-scatters input and probability gradients.
class AllGatherTokenDispatcher : public ExpertParallelDispatcher {
 public:
  AllGatherTokenDispatcher(const comm::ProcessGroup& ep, int64_t num_experts)
      : ExpertParallelDispatcher(ep, num_experts, true) {}
  void dispatch(const Tensor& x_TH, const RoutedTokens& routed, DispatchPlan& plan, Tensor& x_RH,
                Tensor& probs_R) override;
  Tensor combine(const Tensor& y_RH, const DispatchPlan& plan) override;
  Tensor combine_backward(const Tensor& dy_TH, const DispatchPlan& plan) override;
  void dispatch_backward(const Tensor& dx_RH, const Tensor& dprobs_R, const DispatchPlan& plan, DType probs_dtype,
                         Tensor& dx_TH, Tensor& dprobs_TK) override;

 private:
  Tensor gather(const Tensor& t_local) const;     // [T, C] -> [P·T, C]
  Tensor scatter_sum(const Tensor& t_all) const;  // [P·T, C] -> [T, C], summed over ranks
};

}  // namespace moecore::moe
