// The flex token dispatcher (see flex_dispatcher.h): one token row per (token, destination rank) each way, the
// routing beside it, the expansion to expert rows and the per-rank partial sums on the experts' rank.
#include "moecore/moe/flex_dispatcher.h"

#include <cstring>

#include "moecore/comm/process_group.h"
#include "moecore/core/timers.h"

namespace moecore::moe {

using kernels::moe_row_sum_dtype;
using kernels::padded_rows_empty;

namespace {

// A CSR over `n` owners from the owner of each item (−1: none), items in ascending order within an owner.
void owner_csr(const std::vector<int64_t>& owner_of_item, int64_t n, Tensor& offsets, Tensor& items) {
  offsets = Tensor::zeros({n + 1}, DType::I64);
  int64_t* off = offsets.data<int64_t>();
  for (int64_t o : owner_of_item)
    if (o >= 0) off[o + 1]++;
  for (int64_t i = 0; i < n; i++) off[i + 1] += off[i];
  items = Tensor::empty({off[n]}, DType::I32);
  int32_t* it = items.data<int32_t>();
  std::vector<int64_t> cursor(off, off + n);
  for (size_t i = 0; i < owner_of_item.size(); i++)
    if (owner_of_item[i] >= 0) it[cursor[static_cast<size_t>(owner_of_item[i])]++] = static_cast<int32_t>(i);
}

int64_t total(const std::vector<int64_t>& v) {
  int64_t s = 0;
  for (int64_t x : v) s += x;
  return s;
}

}  // namespace

void FlexTokenDispatcher::plan_exchange(const RoutedTokens& routed, int64_t record_words, DispatchPlan& plan,
                                        Tensor& records) const {
  const int64_t T = routed.idx_TK.dim(0), P = ep_.size(), me = ep_.rank();
  plan.T = T;
  plan.E = E_;
  plan.K = routed.idx_TK.dim(1);
  // Every (token, expert) assignment's row, expert-major over all E experts: rank d's rows are contiguous. Only the
  // plan: no row of x_TH is copied here.
  kernels::moe_permute_plan(routed.idx_TK, E_, routed.pad_capacity, T, /*row_align=*/1, plan);
  plan.local_rows = plan.R;
  const int32_t* row_tok = plan.row_token_R.data<int32_t>();
  plan.input_splits.assign(static_cast<size_t>(P), 0);
  plan.send_tokens.assign(static_cast<size_t>(P), 0);
  // Per destination rank, its distinct tokens in ascending order (the send buffer's rows), and for every
  // assignment its token's row among them and its local expert (the routing that travels with the tokens).
  records = Tensor::empty({plan.R, record_words}, DType::I32);
  int32_t* rec = records.data<int32_t>();
  std::vector<int32_t> send_tok, slot(static_cast<size_t>(T), -1);
  std::vector<char> mark(static_cast<size_t>(T), 0);
  int64_t row = 0;
  for (int64_t d = 0; d < P; d++) {
    int64_t rows_d = 0;
    for (int64_t le = 0; le < n_local_; le++) rows_d += plan.tokens_per_expert[static_cast<size_t>(d * n_local_ + le)];
    for (int64_t r = row; r < row + rows_d; r++) {
      MOE_ASSERT(row_tok[r] >= 0);
      mark[static_cast<size_t>(row_tok[r])] = 1;
    }
    const size_t base = send_tok.size();
    for (int64_t t = 0; t < T; t++)
      if (mark[static_cast<size_t>(t)]) {
        slot[static_cast<size_t>(t)] = static_cast<int32_t>(send_tok.size() - base);
        send_tok.push_back(static_cast<int32_t>(t));
        mark[static_cast<size_t>(t)] = 0;
      }
    plan.send_tokens[static_cast<size_t>(d)] = static_cast<int64_t>(send_tok.size() - base);
    plan.input_splits[static_cast<size_t>(d)] = rows_d;
    for (int64_t le = 0; le < n_local_; le++)
      for (int64_t i = 0; i < plan.tokens_per_expert[static_cast<size_t>(d * n_local_ + le)]; i++, row++) {
        rec[record_words * row] = slot[static_cast<size_t>(row_tok[row])];
        rec[record_words * row + 1] = static_cast<int32_t>(le);
      }
  }
  const int64_t n_sent = static_cast<int64_t>(send_tok.size());
  plan.send_token = Tensor::empty({n_sent}, DType::I32);
  std::vector<int64_t> token_of_sent(send_tok.begin(), send_tok.end());
  for (int64_t i = 0; i < n_sent; i++) plan.send_token.data<int32_t>()[i] = send_tok[static_cast<size_t>(i)];
  owner_csr(token_of_sent, T, plan.sent_offsets_T1, plan.sent_of_token);  // sent rows are rank-major: ascending rank
  // Count exchange: every rank's assignments per expert and tokens per destination rank.
  const int64_t W = E_ + P;
  Tensor counts = Tensor::empty({W}, DType::I64), all = Tensor::empty({P, W}, DType::I64);
  for (int64_t e = 0; e < E_; e++) counts.data<int64_t>()[e] = plan.tokens_per_expert[static_cast<size_t>(e)];
  for (int64_t d = 0; d < P; d++) counts.data<int64_t>()[E_ + d] = plan.send_tokens[static_cast<size_t>(d)];
  {
    TimerScope timer("moe-dispatch-all-to-all", 2);
    ep_.all_gather(counts, all);
  }
  const int64_t* g = all.data<int64_t>();
  plan.output_splits.assign(static_cast<size_t>(P), 0);
  plan.recv_tokens.assign(static_cast<size_t>(P), 0);
  for (int64_t s = 0; s < P; s++) {
    for (int64_t le = 0; le < n_local_; le++)
      plan.output_splits[static_cast<size_t>(s)] += g[s * W + me * n_local_ + le];
    plan.recv_tokens[static_cast<size_t>(s)] = g[s * W + E_ + me];
  }
  plan.recv_rows = total(plan.output_splits);
  // The received assignments arrive as [source rank][local expert]; the experts' rows are expert-major
  // ([local expert][source rank], each chunk in its source's order), each expert's starting at row_align. From
  // here on tokens_per_expert counts rows per local expert.
  plan.row_assign = expert_major_order(P, n_local_, g, W, me * n_local_, plan.tokens_per_expert, plan.row_align);
  plan.R = plan.row_assign.numel();
}

void FlexTokenDispatcher::dispatch(const Tensor& x_TH, const RoutedTokens& routed, DispatchPlan& plan, Tensor& x_RH,
                                   Tensor& probs_R) {
  Pending p;
  dispatch_start(x_TH, routed, plan, p);
  dispatch_finish(p, plan, x_RH, probs_R);
}

void FlexTokenDispatcher::dispatch_start(const Tensor& x_TH, const RoutedTokens& routed, DispatchPlan& plan,
                                         Pending& p) {
  MOE_CHECK(x_TH.device().is_cpu(), "--moe-token-dispatcher-type flex runs on the CPU only (tokens on {})",
            x_TH.device().str());
  const int64_t H = x_TH.cols();
  const DType rows_t = plan.rows_dtype_for(x_TH), probs_t = moe_row_sum_dtype(rows_t);
  // Each assignment's routing record travels as one row of 32-bit words: its token's row among the destination's,
  // its local expert (both written by plan_exchange), then its probability's bytes (one or two words). One exchange
  // beside the tokens', so flex posts as many exchanges as alltoall, and nothing waits before dispatch_finish.
  const int64_t pw = static_cast<int64_t>(dtype_size(probs_t)) / 4, W = 2 + pw;
  plan_exchange(routed, W, plan, p.send_b);
  // The send buffers, gathered straight from the tokens and the [T, K] probabilities (the fused permutation).
  p.send_a = Tensor::empty({plan.send_token.numel(), H}, rows_t);
  kernels::moe_gather_rows(x_TH, plan.send_token, p.send_a);
  Tensor probs = Tensor::empty({plan.local_rows}, probs_t);
  kernels::moe_gather_probs(routed.probs_TK, plan.row_tk_R, probs);
  int32_t* rec = p.send_b.data<int32_t>();
  const char* prob = static_cast<const char*>(probs.raw());
  for (int64_t a = 0; a < plan.local_rows; a++)
    std::memcpy(rec + a * W + 2, prob + a * pw * 4, static_cast<size_t>(pw) * 4);
  p.out_b = Tensor::empty({plan.recv_rows, W}, DType::I32);
  p.out_a = Tensor::empty({total(plan.recv_tokens), H}, rows_t);
  TimerScope timer("moe-dispatch-all-to-all", 2);
  p.work_b = ep_.all_to_all_v(p.send_b, plan.input_splits, p.out_b, plan.output_splits, true);
  p.work_a = ep_.all_to_all_v(p.send_a, plan.send_tokens, p.out_a, plan.recv_tokens, true);
}

void FlexTokenDispatcher::complete_plan(const Tensor& records, DispatchPlan& plan) const {
  const int64_t P = ep_.size(), W = records.cols();
  const int32_t* rec = records.data<int32_t>();
  // Each received assignment's token among the received rows, then every expert row's.
  std::vector<int64_t> token_of_assign(static_cast<size_t>(plan.recv_rows));
  for (int64_t s = 0, a = 0, tok0 = 0; s < P; tok0 += plan.recv_tokens[static_cast<size_t>(s)], s++)
    for (int64_t i = 0; i < plan.output_splits[static_cast<size_t>(s)]; i++, a++) {
      MOE_ASSERT(rec[W * a] >= 0 && rec[W * a] < plan.recv_tokens[static_cast<size_t>(s)]);
      token_of_assign[static_cast<size_t>(a)] = tok0 + rec[W * a];
    }
  plan.sorted_from_recv = Tensor::empty({plan.R}, DType::I32);
  const int32_t* ra = plan.row_assign.data<int32_t>();
  int32_t* sf = plan.sorted_from_recv.data<int32_t>();
  std::vector<int64_t> token_of_row(static_cast<size_t>(plan.R));
  for (int64_t r = 0; r < plan.R; r++) {
    const int64_t t = ra[r] >= 0 ? token_of_assign[static_cast<size_t>(ra[r])] : -1;
    sf[r] = static_cast<int32_t>(t);
    token_of_row[static_cast<size_t>(r)] = t;
  }
  owner_csr(token_of_row, total(plan.recv_tokens), plan.recv_offsets, plan.recv_expert_rows);  // ascending expert
}

Tensor FlexTokenDispatcher::expand_rows(const Tensor& recv, const Tensor& rows_of, const DispatchPlan& plan) const {
  Tensor out = padded_rows_empty(plan.recv_rows, n_local_, plan.row_align, plan.R, recv.cols(), recv.dtype());
  kernels::moe_gather_rows(recv, rows_of, out);
  return out;
}

void FlexTokenDispatcher::dispatch_finish(Pending& p, DispatchPlan& plan, Tensor& x_RH, Tensor& probs_R) {
  {
    TimerScope timer("moe-dispatch-all-to-all", 2);
    p.work_b.wait();
    p.work_a.wait();
  }
  complete_plan(p.out_b, plan);
  // The received probabilities out of their records, then the expansion to the experts' rows, straight from the
  // receive buffers.
  const int64_t W = p.out_b.cols(), pw = W - 2;
  Tensor probs = Tensor::empty({plan.recv_rows, 1}, moe_row_sum_dtype(p.out_a.dtype()));
  MOE_ASSERT(static_cast<int64_t>(dtype_size(probs.dtype())) == 4 * pw);
  for (int64_t a = 0; a < plan.recv_rows; a++)
    std::memcpy(static_cast<char*>(probs.raw()) + a * pw * 4, p.out_b.data<int32_t>() + a * W + 2,
                static_cast<size_t>(pw) * 4);
  x_RH = expand_rows(p.out_a, plan.sorted_from_recv, plan);
  probs_R = expand_rows(probs, plan.row_assign, plan).reshape({plan.R});
  p = Pending();
}

Tensor FlexTokenDispatcher::sum_per_received_token(const Tensor& rows_RH, const DispatchPlan& plan) const {
  MOE_ASSERT(rows_RH.rows() == plan.R);
  Tensor per = Tensor::empty({plan.recv_offsets.numel() - 1, rows_RH.cols()}, moe_row_sum_dtype(rows_RH.dtype()));
  kernels::moe_sum_rows_per_token(rows_RH, plan.recv_offsets, plan.recv_expert_rows, per);
  return per;
}

comm::Work FlexTokenDispatcher::tokens_back_start(const Tensor& per_recv, const DispatchPlan& plan,
                                                  Tensor& back) const {
  back = Tensor::empty({plan.send_token.numel(), per_recv.cols()}, per_recv.dtype());
  return ep_.all_to_all_v(per_recv, plan.recv_tokens, back, plan.send_tokens, /*async=*/true);
}

Tensor FlexTokenDispatcher::combine(const Tensor& y_RH, const DispatchPlan& plan) {
  Pending p;
  combine_start(y_RH, plan, p);
  return combine_finish(p, plan);
}

void FlexTokenDispatcher::combine_start(const Tensor& y_RH, const DispatchPlan& plan, Pending& p) {
  p.send_a = sum_per_received_token(y_RH, plan);
  p.work_a = tokens_back_start(p.send_a, plan, p.out_a);
}

Tensor FlexTokenDispatcher::combine_finish(Pending& p, const DispatchPlan& plan) {
  {
    TimerScope timer("moe-combine-all-to-all", 2);
    p.work_a.wait();
  }
  Tensor y = Tensor::empty({plan.T, p.out_a.cols()}, p.out_a.dtype());
  kernels::moe_sum_rows_per_token(p.out_a, plan.sent_offsets_T1, plan.sent_of_token, y);
  p = Pending();
  return y;
}

Tensor FlexTokenDispatcher::combine_backward(const Tensor& dy_TH, const DispatchPlan& plan) {
  Pending p;
  combine_backward_start(dy_TH, plan, p);
  return combine_backward_finish(p, plan);
}

void FlexTokenDispatcher::combine_backward_start(const Tensor& dy_TH, const DispatchPlan& plan, Pending& p) {
  p.send_a = Tensor::empty({plan.send_token.numel(), dy_TH.cols()}, plan.rows_dtype_for(dy_TH));
  kernels::moe_gather_rows(dy_TH, plan.send_token, p.send_a);
  p.out_a = Tensor::empty({total(plan.recv_tokens), dy_TH.cols()}, p.send_a.dtype());
  p.work_a = ep_.all_to_all_v(p.send_a, plan.send_tokens, p.out_a, plan.recv_tokens, /*async=*/true);
}

Tensor FlexTokenDispatcher::combine_backward_finish(Pending& p, const DispatchPlan& plan) {
  {
    TimerScope timer("moe-dispatch-all-to-all", 2);
    p.work_a.wait();
  }
  Tensor d = expand_rows(p.out_a, plan.sorted_from_recv, plan);
  p = Pending();
  return d;
}

void FlexTokenDispatcher::dispatch_backward_start(const Tensor& dx_RH, const Tensor& dprobs_R, const DispatchPlan& plan,
                                                  PendingBackward& p) {
  p.dx_send = sum_per_received_token(dx_RH, plan);
  p.dx_work = tokens_back_start(p.dx_send, plan, p.dx_local);
  MOE_ASSERT(dprobs_R.numel() == plan.R);
  p.dp_send = Tensor::zeros({plan.recv_rows, 1}, dprobs_R.dtype());
  kernels::moe_scatter_rows(dprobs_R.reshape({plan.R, 1}), plan.row_assign, p.dp_send);  // gap rows dropped
  p.dp_local = Tensor::empty({plan.local_rows, 1}, dprobs_R.dtype());
  p.dp_work = ep_.all_to_all_v(p.dp_send, plan.output_splits, p.dp_local, plan.input_splits, /*async=*/true);
}

void FlexTokenDispatcher::dispatch_backward_finish(PendingBackward& p, const DispatchPlan& plan, DType probs_dtype,
                                                   Tensor& dx_TH, Tensor& dprobs_TK) {
  {
    TimerScope timer("moe-combine-all-to-all", 2);
    p.dx_work.wait();
    p.dp_work.wait();
  }
  dx_TH = Tensor::empty({plan.T, p.dx_local.cols()}, p.dx_local.dtype());
  kernels::moe_sum_rows_per_token(p.dx_local, plan.sent_offsets_T1, plan.sent_of_token, dx_TH);
  dprobs_TK = Tensor::empty({plan.T, plan.K}, probs_dtype);
  kernels::moe_scatter_probs(p.dp_local.reshape({plan.local_rows}), plan.row_tk_R, dprobs_TK);
  p = PendingBackward();
}

void FlexTokenDispatcher::dispatch_backward(const Tensor& dx_RH, const Tensor& dprobs_R, const DispatchPlan& plan,
                                            DType probs_dtype, Tensor& dx_TH, Tensor& dprobs_TK) {
  PendingBackward p;
  dispatch_backward_start(dx_RH, dprobs_R, plan, p);
  dispatch_backward_finish(p, plan, probs_dtype, dx_TH, dprobs_TK);
}

}  // namespace moecore::moe
