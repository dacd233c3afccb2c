// Token dispatchers (see token_dispatcher.h): the local permutation, and the all-to-all and all-gather exchanges
// over expert parallelism around it. The row work is kernels/moe_permute.h's ops, on the tensors' device.
#include "moecore/moe/token_dispatcher.h"

#include <algorithm>
#include <utility>

#include "moecore/comm/process_group.h"
#include "moecore/core/timers.h"
#include "moecore/nn/stash_bytes.h"

namespace moecore::moe {

using kernels::align_up;
using kernels::moe_row_sum_dtype;
using kernels::padded_rows_empty;

namespace {

// dst_TH[t] = the sum of token t's rows in ascending order, in moe_row_sum_dtype (bf16 rows are summed in f32).
Tensor sum_rows_per_token(const Tensor& src_RH, const DispatchPlan& plan) {
  Tensor y = Tensor::empty({plan.T, src_RH.cols()}, moe_row_sum_dtype(src_RH.dtype()), src_RH.device());
  kernels::moe_sum_rows_per_token(src_RH, plan.token_offsets_T1, plan.token_rows, y);
  return y;
}

// dprobs_TK [T, K] in probs_dtype from the permuted rows' probability gradients: row r's goes to entry row_tk_R[r]
// (padding rows, −1, are dropped; entries no row holds stay 0). On the rows' device.
Tensor scatter_dprobs(const Tensor& dprobs_rows, const DispatchPlan& plan, DType probs_dtype) {
  const int64_t n = plan.row_tk_R.numel();
  MOE_ASSERT_MSG(dprobs_rows.numel() == n, "{} row probability gradients for {} permuted rows", dprobs_rows.numel(), n);
  Tensor d = Tensor::empty({plan.T, plan.K}, probs_dtype, dprobs_rows.device());
  kernels::moe_scatter_probs(dprobs_rows, plan.row_tk_R, d);
  return d;
}

}  // namespace

Tensor expert_major_order(int64_t ranks, int64_t n_local, const int64_t* counts, int64_t stride, int64_t offset,
                          std::vector<int64_t>& per_expert, int64_t row_align) {
  auto count = [&](int64_t s, int64_t e) { return counts[s * stride + offset + e]; };
  Tensor start_t = Tensor::empty({std::max<int64_t>(ranks * n_local, 1)}, DType::I64);
  int64_t* chunk_start = start_t.data<int64_t>();
  int64_t off = 0;
  for (int64_t s = 0; s < ranks; s++)
    for (int64_t e = 0; e < n_local; e++) {
      chunk_start[s * n_local + e] = off;
      off += count(s, e);
    }
  per_expert.assign(static_cast<size_t>(n_local), 0);
  for (int64_t e = 0; e < n_local; e++)
    for (int64_t s = 0; s < ranks; s++) per_expert[static_cast<size_t>(e)] += count(s, e);
  int64_t rows = 0;
  for (int64_t c : per_expert) rows += align_up(c, row_align);
  Tensor order = Tensor::empty({rows}, DType::I32);
  int32_t* perm = order.data<int32_t>();
  int64_t row = 0;
  for (int64_t e = 0; e < n_local; e++) {
    for (int64_t s = 0; s < ranks; s++) {
      const int64_t n = count(s, e), start = chunk_start[s * n_local + e];
      for (int64_t i = 0; i < n; i++) perm[row++] = static_cast<int32_t>(start + i);
    }
    const int64_t c = per_expert[static_cast<size_t>(e)];
    for (int64_t i = c; i < align_up(c, row_align); i++) perm[row++] = -1;  // gap rows
  }
  return order;
}

void LocalTokenDispatcher::dispatch(const Tensor& x_TH, const RoutedTokens& routed, DispatchPlan& plan, Tensor& x_RH,
                                    Tensor& probs_R) {
  permute(x_TH, routed.idx_TK, routed.probs_TK, routed.pad_capacity, routed.idx_TK.dim(0), plan.row_align, plan, x_RH,
          probs_R);
}

void LocalTokenDispatcher::permute(const Tensor& x_TH, const Tensor& idx_TK, const Tensor& probs_TK,
                                   int64_t pad_capacity, int64_t block, int64_t row_align, DispatchPlan& plan,
                                   Tensor& x_RH, Tensor& probs_R) const {
  const int64_t T = idx_TK.dim(0), K = idx_TK.dim(1);
  const Device d = x_TH.device();
  MOE_ASSERT(x_TH.rows() == T && probs_TK.numel() == T * K);
  MOE_ASSERT_MSG(idx_TK.device() == d && probs_TK.device() == d, "dispatch on {}: the routing is on {} and {}", d.str(),
                 idx_TK.device().str(), probs_TK.device().str());
  plan.T = T;
  plan.E = E_;
  plan.K = K;
  kernels::moe_permute_plan(idx_TK, E_, pad_capacity, block, row_align, plan);
  // Sized for the most rows the padded layout can take: the same allocation every step however the rows fall.
  const int64_t rows = plan.token_rows.numel();
  const DType rows_t = plan.rows_dtype_for(x_TH);
  x_RH = padded_rows_empty(rows, E_, row_align, plan.R, x_TH.cols(), rows_t, d);
  kernels::moe_gather_rows(x_TH, plan.row_token_R, x_RH);
  probs_R = padded_rows_empty(rows, E_, row_align, plan.R, 1, moe_row_sum_dtype(rows_t), d).reshape({plan.R});
  kernels::moe_gather_probs(probs_TK, plan.row_tk_R, probs_R);
}

Tensor LocalTokenDispatcher::combine(const Tensor& y_RH, const DispatchPlan& plan) {
  return sum_rows_per_token(y_RH, plan);
}

Tensor LocalTokenDispatcher::combine_backward(const Tensor& dy_TH, const DispatchPlan& plan) {
  Tensor d = padded_rows_empty(plan.token_rows.numel(), plan.E, plan.row_align, plan.R, dy_TH.cols(),
                               plan.rows_dtype_for(dy_TH), dy_TH.device());
  kernels::moe_gather_rows(dy_TH, plan.row_token_R, d);
  return d;
}

void TokenDispatcher::dispatch_backward_start(const Tensor& dx_RH, const Tensor& dprobs_R, const DispatchPlan&,
                                              PendingBackward& p) {
  p.dx_RH = dx_RH;
  p.dprobs_R = dprobs_R;
}

void TokenDispatcher::dispatch_backward_finish(PendingBackward& p, const DispatchPlan& plan, DType probs_dtype,
                                               Tensor& dx_TH, Tensor& dprobs_TK) {
  dispatch_backward(p.dx_RH, p.dprobs_R, plan, probs_dtype, dx_TH, dprobs_TK);
  p = PendingBackward();
}

void TokenDispatcher::dispatch_start(const Tensor& x_TH, const RoutedTokens& routed, DispatchPlan& plan, Pending& p) {
  dispatch(x_TH, routed, plan, p.out_a, p.out_b);
}

void TokenDispatcher::dispatch_finish(Pending& p, DispatchPlan&, Tensor& x_RH, Tensor& probs_R) {
  x_RH = std::move(p.out_a);
  probs_R = std::move(p.out_b);
  p = Pending();
}

void TokenDispatcher::combine_start(const Tensor& y_RH, const DispatchPlan& plan, Pending& p) {
  p.out_a = combine(y_RH, plan);
}

Tensor TokenDispatcher::combine_finish(Pending& p, const DispatchPlan&) {
  Tensor y = std::move(p.out_a);
  p = Pending();
  return y;
}

void TokenDispatcher::combine_backward_start(const Tensor& dy_TH, const DispatchPlan& plan, Pending& p) {
  p.out_a = combine_backward(dy_TH, plan);
}

Tensor TokenDispatcher::combine_backward_finish(Pending& p, const DispatchPlan& plan) {
  return combine_finish(p, plan);
}

void LocalTokenDispatcher::dispatch_backward(const Tensor& dx_RH, const Tensor& dprobs_R, const DispatchPlan& plan,
                                             DType probs_dtype, Tensor& dx_TH, Tensor& dprobs_TK) {
  dx_TH = sum_rows_per_token(dx_RH, plan);
  dprobs_TK = scatter_dprobs(dprobs_R, plan, probs_dtype);
}

}  // namespace moecore::moe

// --- AlltoAll over expert parallelism ---------------------------------------------------------------------------

namespace moecore::moe {

ExpertParallelDispatcher::ExpertParallelDispatcher(const comm::ProcessGroup& ep, int64_t num_experts,
                                                   bool local_experts_only)
    : ep_(ep),
      E_(num_experts),
      n_local_(num_experts / ep.size()),
      local_(local_experts_only ? num_experts / ep.size() : num_experts) {
  MOE_CHECK(num_experts % ep.size() == 0, "--num-experts {} is not divisible by --expert-model-parallel-size {}",
            num_experts, ep.size());
}

void AllToAllTokenDispatcher::dispatch(const Tensor& x_TH, const RoutedTokens& routed, DispatchPlan& plan, Tensor& x_RH,
                                       Tensor& probs_R) {
  Tensor x_perm, p_perm;
  dispatch_plan(x_TH, routed, plan, x_perm, p_perm);
  // 4. Tokens and probabilities travel separately (probabilities keep their own dtype).
  x_RH = exchange_forward(x_perm, plan);
  probs_R = exchange_forward(p_perm.reshape({p_perm.numel(), 1}), plan).reshape({plan.R});
}

void AllToAllTokenDispatcher::dispatch_plan(const Tensor& x_TH, const RoutedTokens& routed, DispatchPlan& plan,
                                            Tensor& x_perm, Tensor& p_perm) {
  // 1. Local permute over all E experts: rows for EP rank d are contiguous (experts d·n_le .. (d+1)·n_le − 1).
  local_.permute(x_TH, routed.idx_TK, routed.probs_TK, routed.pad_capacity, routed.idx_TK.dim(0), /*row_align=*/1, plan,
                 x_perm, p_perm);  // the rows travel back to back
  const int64_t P = ep_.size(), me = ep_.rank();
  plan.local_rows = plan.R;
  // 2. Count exchange: every rank's tokens per expert.
  Tensor counts = Tensor::empty({E_}, DType::I64), all = Tensor::empty({P, E_}, DType::I64);
  for (int64_t e = 0; e < E_; e++) counts.data<int64_t>()[e] = plan.tokens_per_expert[static_cast<size_t>(e)];
  {
    TimerScope timer("moe-dispatch-all-to-all", 2);  // the counts travel with the dispatch
    ep_.all_gather(counts, all);
  }
  const int64_t* g = all.data<int64_t>();
  plan.input_splits.assign(static_cast<size_t>(P), 0);
  plan.output_splits.assign(static_cast<size_t>(P), 0);
  for (int64_t d = 0; d < P; d++)
    for (int64_t le = 0; le < n_local_; le++) {
      plan.input_splits[static_cast<size_t>(d)] += plan.tokens_per_expert[static_cast<size_t>(d * n_local_ + le)];
      plan.output_splits[static_cast<size_t>(d)] += g[d * E_ + me * n_local_ + le];
    }
  // 3. Received layout [source rank][local expert] -> expert-major [local expert][source rank]; from here on
  // tokens_per_expert counts rows per local expert.
  plan.sorted_from_recv = expert_major_order(P, n_local_, g, E_, me * n_local_, plan.tokens_per_expert, plan.row_align);
  plan.sorted_from_recv = plan.sorted_from_recv.to(x_TH.device());
  plan.recv_rows = 0;
  for (int64_t n : plan.output_splits) plan.recv_rows += n;
  plan.R = plan.sorted_from_recv.numel();
}

Tensor AllToAllTokenDispatcher::exchange_forward(const Tensor& local_rows, const DispatchPlan& plan) const {
  Tensor send, recv;
  comm::Work w = exchange_forward_start(local_rows, plan, send, recv);
  {
    // moecore's MoE timers (core/timers.h) by direction: token ranks to expert ranks is the dispatch (its forward,
    // and combine's backward), back is the combine.
    TimerScope timer("moe-dispatch-all-to-all", 2);
    w.wait();
  }
  return sort_received(recv, plan);
}

comm::Work AllToAllTokenDispatcher::exchange_forward_start(const Tensor& local_rows, const DispatchPlan& plan,
                                                           Tensor& send, Tensor& recv) const {
  const int64_t C = local_rows.cols();
  recv = Tensor::empty({plan.recv_rows, C}, local_rows.dtype(), local_rows.device());
  send = local_rows.reshape({plan.local_rows, C});
  return ep_.all_to_all_v(send, plan.input_splits, recv, plan.output_splits, /*async=*/true);
}

Tensor AllToAllTokenDispatcher::sort_received(const Tensor& recv, const DispatchPlan& plan) const {
  Tensor sorted =
      padded_rows_empty(plan.recv_rows, n_local_, plan.row_align, plan.R, recv.cols(), recv.dtype(), recv.device());
  kernels::moe_gather_rows(recv, plan.sorted_from_recv, sorted);
  return sorted;
}

comm::Work AllToAllTokenDispatcher::exchange_backward_start(const Tensor& sorted_rows, const DispatchPlan& plan,
                                                            Tensor& send, Tensor& local) const {
  const int64_t H = sorted_rows.cols();
  MOE_ASSERT(sorted_rows.rows() == plan.R);
  const Device d = sorted_rows.device();
  send = Tensor::empty({plan.recv_rows, H}, sorted_rows.dtype(), d);
  kernels::moe_scatter_rows(sorted_rows, plan.sorted_from_recv, send);
  local = Tensor::empty({plan.local_rows, H}, sorted_rows.dtype(), d);
  return ep_.all_to_all_v(send, plan.output_splits, local, plan.input_splits, /*async=*/true);
}

Tensor AllToAllTokenDispatcher::exchange_backward(const Tensor& sorted_rows, const DispatchPlan& plan) const {
  Tensor send, local;
  comm::Work w = exchange_backward_start(sorted_rows, plan, send, local);
  TimerScope timer("moe-combine-all-to-all", 2);
  w.wait();
  return local;
}

Tensor AllToAllTokenDispatcher::combine(const Tensor& y_RH, const DispatchPlan& plan) {
  return sum_rows_per_token(exchange_backward(y_RH, plan), plan);
}

Tensor AllToAllTokenDispatcher::combine_backward(const Tensor& dy_TH, const DispatchPlan& plan) {
  Tensor local = Tensor::empty({plan.local_rows, dy_TH.cols()}, plan.rows_dtype_for(dy_TH), dy_TH.device());
  kernels::moe_gather_rows(dy_TH, plan.row_token_R, local);
  return exchange_forward(local, plan);
}

void AllToAllTokenDispatcher::dispatch_backward(const Tensor& dx_RH, const Tensor& dprobs_R, const DispatchPlan& plan,
                                                DType probs_dtype, Tensor& dx_TH, Tensor& dprobs_TK) {
  dx_TH = sum_rows_per_token(exchange_backward(dx_RH, plan), plan);
  const Tensor dp_local = exchange_backward(dprobs_R.reshape({dprobs_R.numel(), 1}), plan);
  dprobs_TK = scatter_dprobs(dp_local, plan, probs_dtype);
}

void AllToAllTokenDispatcher::dispatch_backward_start(const Tensor& dx_RH, const Tensor& dprobs_R,
                                                      const DispatchPlan& plan, PendingBackward& p) {
  p.dx_work = exchange_backward_start(dx_RH, plan, p.dx_send, p.dx_local);
  p.dp_work = exchange_backward_start(dprobs_R.reshape({dprobs_R.numel(), 1}), plan, p.dp_send, p.dp_local);
}

void AllToAllTokenDispatcher::dispatch_backward_finish(PendingBackward& p, const DispatchPlan& plan, DType probs_dtype,
                                                       Tensor& dx_TH, Tensor& dprobs_TK) {
  {
    TimerScope timer("moe-combine-all-to-all", 2);
    p.dx_work.wait();
    p.dp_work.wait();
  }
  dx_TH = sum_rows_per_token(p.dx_local, plan);
  dprobs_TK = scatter_dprobs(p.dp_local, plan, probs_dtype);
  p = PendingBackward();
}

// The split forms (token_dispatcher.h): the permutation and plan before the exchange, the row moves after it.
void AllToAllTokenDispatcher::dispatch_start(const Tensor& x_TH, const RoutedTokens& routed, DispatchPlan& plan,
                                             Pending& p) {
  Tensor x_perm, p_perm;
  dispatch_plan(x_TH, routed, plan, x_perm, p_perm);
  p.work_a = exchange_forward_start(x_perm, plan, p.send_a, p.out_a);
  p.work_b = exchange_forward_start(p_perm.reshape({p_perm.numel(), 1}), plan, p.send_b, p.out_b);
}

void AllToAllTokenDispatcher::dispatch_finish(Pending& p, DispatchPlan& plan, Tensor& x_RH, Tensor& probs_R) {
  {
    TimerScope timer("moe-dispatch-all-to-all", 2);
    p.work_a.wait();
    p.work_b.wait();
  }
  x_RH = sort_received(p.out_a, plan);
  probs_R = sort_received(p.out_b, plan).reshape({plan.R});
  p = Pending();
}

void AllToAllTokenDispatcher::combine_start(const Tensor& y_RH, const DispatchPlan& plan, Pending& p) {
  p.work_a = exchange_backward_start(y_RH, plan, p.send_a, p.out_a);
}

Tensor AllToAllTokenDispatcher::combine_finish(Pending& p, const DispatchPlan& plan) {
  {
    TimerScope timer("moe-combine-all-to-all", 2);
    p.work_a.wait();
  }
  Tensor y = sum_rows_per_token(p.out_a, plan);
  p = Pending();
  return y;
}

void AllToAllTokenDispatcher::combine_backward_start(const Tensor& dy_TH, const DispatchPlan& plan, Pending& p) {
  Tensor local = Tensor::empty({plan.local_rows, dy_TH.cols()}, plan.rows_dtype_for(dy_TH), dy_TH.device());
  kernels::moe_gather_rows(dy_TH, plan.row_token_R, local);
  p.work_a = exchange_forward_start(local, plan, p.send_a, p.out_a);
}

Tensor AllToAllTokenDispatcher::combine_backward_finish(Pending& p, const DispatchPlan& plan) {
  {
    TimerScope timer("moe-dispatch-all-to-all", 2);
    p.work_a.wait();
  }
  Tensor d = sort_received(p.out_a, plan);
  p = Pending();
  return d;
}

}  // namespace moecore::moe

// --- AllGather over expert parallelism --------------------------------------------------------------------------

namespace moecore::moe {

Tensor AllGatherTokenDispatcher::gather(const Tensor& t) const {
  Tensor all = Tensor::empty({t.rows() * ep_.size(), t.cols()}, t.dtype(), t.device());
  TimerScope timer("moe-dispatch-all-gather", 2);  // as the all-to-all's (dispatch: tokens to experts)
  ep_.all_gather(t.reshape({t.rows(), t.cols()}), all);
  return all;
}

Tensor AllGatherTokenDispatcher::scatter_sum(const Tensor& t) const {
  Tensor out = Tensor::empty({t.rows() / ep_.size(), t.cols()}, t.dtype(), t.device());
  TimerScope timer("moe-combine-reduce-scatter", 2);
  ep_.reduce_scatter(t, out);
  return out;
}

void AllGatherTokenDispatcher::dispatch(const Tensor& x_TH, const RoutedTokens& routed, DispatchPlan& plan,
                                        Tensor& x_RH, Tensor& probs_R) {
  const int64_t T = routed.idx_TK.dim(0), K = routed.idx_TK.dim(1), first = ep_.rank() * n_local_;
  // On the GPU the ids are renumbered on a host copy (the gather stages them through the host anyway).
  const Tensor x_all = gather(x_TH.as_dtype(plan.rows_dtype_for(x_TH))),
               id_all = gather(routed.idx_TK).to(Device::cpu()), p_all = gather(routed.probs_TK);
  // This rank's experts, renumbered from 0; other ranks' experts and dropped assignments become −1.
  const int64_t n = id_all.numel();
  Tensor id_loc = Tensor::empty({n / K, K}, DType::I32);
  const int32_t* ga = id_all.data<int32_t>();
  int32_t* gl = id_loc.data<int32_t>();
  for (int64_t i = 0; i < n; i++)
    gl[i] = ga[i] >= first && ga[i] < first + n_local_ ? static_cast<int32_t>(ga[i] - first) : -1;
  // Padding fills each expert from every source rank's own T tokens, as that rank's router would.
  local_.permute(x_all, id_loc.to(x_TH.device()), p_all, routed.pad_capacity, T, plan.row_align, plan, x_RH, probs_R);
  plan.T_local = T;
}

Tensor AllGatherTokenDispatcher::combine(const Tensor& y_RH, const DispatchPlan& plan) {
  return scatter_sum(local_.combine(y_RH, plan));
}

Tensor AllGatherTokenDispatcher::combine_backward(const Tensor& dy_TH, const DispatchPlan& plan) {
  return local_.combine_backward(gather(dy_TH.as_dtype(plan.rows_dtype_for(dy_TH))), plan);
}

void AllGatherTokenDispatcher::dispatch_backward(const Tensor& dx_RH, const Tensor& dprobs_R, const DispatchPlan& plan,
                                                 DType probs_dtype, Tensor& dx_TH, Tensor& dprobs_TK) {
  Tensor dx_all, dp_all;
  local_.dispatch_backward(dx_RH, dprobs_R, plan, probs_dtype, dx_all, dp_all);
  dx_TH = scatter_sum(dx_all);
  // An assignment's gradient lives on the rank of its expert (0 elsewhere): the sum over ranks assembles them.
  dprobs_TK = scatter_sum(dp_all);
}

// What dispatch leaves in the DispatchPlan (nn/stash_bytes.h).
int64_t dispatch_plan_bytes(int64_t T, int64_t rows, int64_t received, bool ep) {
  int64_t b = nn::tensor_bytes(T + 1, DType::I64) + nn::tensor_bytes(T, DType::I64);  // token_offsets, cursor
  b += 2 * nn::tensor_bytes(rows, DType::I32) + nn::tensor_bytes(rows, DType::I64);   // row_token, token_rows, row_tk
  if (ep) b += nn::tensor_bytes(received, DType::I32);                                // sorted_from_recv
  return b;
}

}  // namespace moecore::moe
