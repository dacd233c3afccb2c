// Local token dispatcher (see token_dispatcher.h).
#include "moecore/moe/token_dispatcher.h"

#include <cstring>

#include "moecore/comm/process_group.h"

namespace moecore::moe {

void gather_rows(const Tensor& src_TH, const Tensor& row_token_R, Tensor& dst_RH) {
  const int64_t R = row_token_R.numel(), H = src_TH.cols();
  MOE_ASSERT(dst_RH.rows() == R && dst_RH.cols() == H && dst_RH.dtype() == src_TH.dtype());
  const size_t bytes = static_cast<size_t>(H) * dtype_size(src_TH.dtype());
  const char* s = static_cast<const char*>(src_TH.raw());
  char* d = static_cast<char*>(dst_RH.raw());
  const int32_t* tok = row_token_R.data<int32_t>();
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < R; r++) std::memcpy(d + r * bytes, s + tok[r] * bytes, bytes);
}

void scatter_rows(const Tensor& src_RH, const Tensor& idx_R, Tensor& dst) {
  const int64_t R = idx_R.numel(), H = src_RH.cols();
  MOE_ASSERT(src_RH.rows() == R && dst.cols() == H && dst.dtype() == src_RH.dtype());
  const size_t bytes = static_cast<size_t>(H) * dtype_size(src_RH.dtype());
  const char* s = static_cast<const char*>(src_RH.raw());
  char* d = static_cast<char*>(dst.raw());
  const int32_t* idx = idx_R.data<int32_t>();
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < R; r++) std::memcpy(d + idx[r] * bytes, s + r * bytes, bytes);
}

Tensor expert_major_order(int64_t ranks, int64_t n_local, const std::function<int64_t(int64_t, int64_t)>& count,
                          std::vector<int64_t>& per_expert) {
  std::vector<int64_t> chunk_start(static_cast<size_t>(ranks * n_local));
  int64_t off = 0;
  for (int64_t s = 0; s < ranks; s++)
    for (int64_t e = 0; e < n_local; e++) {
      chunk_start[static_cast<size_t>(s * n_local + e)] = off;
      off += count(s, e);
    }
  per_expert.assign(static_cast<size_t>(n_local), 0);
  Tensor order = Tensor::empty({off}, DType::I32);
  int32_t* perm = order.data<int32_t>();
  int64_t row = 0;
  for (int64_t e = 0; e < n_local; e++)
    for (int64_t s = 0; s < ranks; s++) {
      const int64_t n = count(s, e), start = chunk_start[static_cast<size_t>(s * n_local + e)];
      for (int64_t i = 0; i < n; i++) perm[row++] = static_cast<int32_t>(start + i);
      per_expert[static_cast<size_t>(e)] += n;
    }
  return order;
}

void sum_rows_per_token(const Tensor& src_RH, const DispatchPlan& plan, Tensor& dst_TH) {
  const int64_t T = plan.T, H = src_RH.cols();
  MOE_ASSERT(dst_TH.rows() == T && dst_TH.cols() == H && dst_TH.dtype() == src_RH.dtype());
  const int64_t* off = plan.token_offsets_T1.data<int64_t>();
  const int32_t* rows = plan.token_rows.data<int32_t>();
  MOE_DISPATCH_FLOAT(src_RH.dtype(), F, {
    const F* s = src_RH.data<F>();
    F* d = dst_TH.data<F>();
    _Pragma("omp parallel for schedule(static)")
    for (int64_t t = 0; t < T; t++) {
      F* out = d + t * H;
      for (int64_t h = 0; h < H; h++) out[h] = 0;
      for (int64_t i = off[t]; i < off[t + 1]; i++) {
        const F* in = s + static_cast<int64_t>(rows[i]) * H;
        for (int64_t h = 0; h < H; h++) out[h] += in[h];
      }
    }
  });
}

void LocalTokenDispatcher::dispatch(const Tensor& x_TH, const Tensor& probs_TE, const Tensor& map_TE,
                                    DispatchPlan& plan, Tensor& x_RH, Tensor& probs_R) {
  const int64_t T = map_TE.dim(0), E = map_TE.dim(1);
  MOE_ASSERT(x_TH.rows() == T && probs_TE.numel() == T * E);
  const int32_t* map = map_TE.data<int32_t>();
  plan.T = T;
  plan.E = E;
  plan.tokens_per_expert.assign(static_cast<size_t>(E), 0);
  std::vector<int64_t> per_token(static_cast<size_t>(T), 0);
  for (int64_t t = 0; t < T; t++)
    for (int64_t e = 0; e < E; e++)
      if (map[t * E + e]) {
        plan.tokens_per_expert[e]++;
        per_token[t]++;
      }
  int64_t R = 0;
  for (int64_t c : plan.tokens_per_expert) R += c;
  plan.R = R;
  plan.row_token_R = Tensor::empty({R}, DType::I32);
  plan.row_te_R = Tensor::empty({R}, DType::I64);
  plan.token_offsets_T1 = Tensor::empty({T + 1}, DType::I64);
  plan.token_rows = Tensor::empty({R}, DType::I32);
  int64_t* off = plan.token_offsets_T1.data<int64_t>();
  off[0] = 0;
  for (int64_t t = 0; t < T; t++) off[t + 1] = off[t] + per_token[t];
  // Expert-major, ascending token inside an expert; each token's rows land in ascending expert order.
  int32_t* rt = plan.row_token_R.data<int32_t>();
  int64_t* rte = plan.row_te_R.data<int64_t>();
  int32_t* trows = plan.token_rows.data<int32_t>();
  std::fill(per_token.begin(), per_token.end(), 0);
  int64_t r = 0;
  for (int64_t e = 0; e < E; e++)
    for (int64_t t = 0; t < T; t++)
      if (map[t * E + e]) {
        rt[r] = static_cast<int32_t>(t);
        rte[r] = t * E + e;
        trows[off[t] + per_token[t]++] = static_cast<int32_t>(r);
        r++;
      }
  x_RH = Tensor::empty({R, x_TH.cols()}, x_TH.dtype());
  gather_rows(x_TH, plan.row_token_R, x_RH);
  probs_R = Tensor::empty({R}, x_TH.dtype() == DType::BF16 ? DType::F32 : x_TH.dtype());
  for (int64_t i = 0; i < R; i++) probs_R.set_item(i, probs_TE.item(rte[i]));
}

Tensor LocalTokenDispatcher::combine(const Tensor& y_RH, const DispatchPlan& plan) {
  Tensor y = Tensor::empty({plan.T, y_RH.cols()}, y_RH.dtype());
  sum_rows_per_token(y_RH, plan, y);
  return y;
}

Tensor LocalTokenDispatcher::combine_backward(const Tensor& dy_TH, const DispatchPlan& plan) {
  Tensor d = Tensor::empty({plan.R, dy_TH.cols()}, dy_TH.dtype());
  gather_rows(dy_TH, plan.row_token_R, d);
  return d;
}

void LocalTokenDispatcher::dispatch_backward(const Tensor& dx_RH, const Tensor& dprobs_R, const DispatchPlan& plan,
                                             DType probs_dtype, Tensor& dx_TH, Tensor& dprobs_TE) {
  dx_TH = Tensor::empty({plan.T, dx_RH.cols()}, dx_RH.dtype());
  sum_rows_per_token(dx_RH, plan, dx_TH);
  dprobs_TE = Tensor::zeros({plan.T, plan.E}, probs_dtype);
  const int64_t* rte = plan.row_te_R.data<int64_t>();
  for (int64_t i = 0; i < plan.R; i++) dprobs_TE.set_item(rte[i], dprobs_R.item(i));
}

}  // namespace moecore::moe

// --- AlltoAll over expert parallelism ---------------------------------------------------------------------------

namespace moecore::moe {

ExpertParallelDispatcher::ExpertParallelDispatcher(const comm::ProcessGroup& ep, int64_t num_experts)
    : ep_(ep), E_(num_experts), n_local_(num_experts / ep.size()) {
  MOE_CHECK(num_experts % ep.size() == 0, "--num-experts {} is not divisible by --expert-model-parallel-size {}",
            num_experts, ep.size());
}

void AllToAllTokenDispatcher::dispatch(const Tensor& x_TH, const Tensor& probs_TE, const Tensor& map_TE,
                                       DispatchPlan& plan, Tensor& x_RH, Tensor& probs_R) {
  // 1. Local permute over all E experts: rows for EP rank d are contiguous (experts d·n_le .. (d+1)·n_le − 1).
  Tensor x_perm, p_perm;
  local_.dispatch(x_TH, probs_TE, map_TE, plan, x_perm, p_perm);
  const int64_t P = ep_.size(), me = ep_.rank();
  plan.local_rows = plan.R;
  // 2. Count exchange: every rank's tokens per expert.
  Tensor counts = Tensor::empty({E_}, DType::I64), all = Tensor::empty({P, E_}, DType::I64);
  for (int64_t e = 0; e < E_; e++) counts.data<int64_t>()[e] = plan.tokens_per_expert[static_cast<size_t>(e)];
  ep_.all_gather(counts, all);
  const int64_t* g = all.data<int64_t>();
  plan.input_splits.assign(static_cast<size_t>(P), 0);
  plan.output_splits.assign(static_cast<size_t>(P), 0);
  for (int64_t d = 0; d < P; d++)
    for (int64_t le = 0; le < n_local_; le++) {
      plan.input_splits[static_cast<size_t>(d)] += plan.tokens_per_expert[static_cast<size_t>(d * n_local_ + le)];
      plan.output_splits[static_cast<size_t>(d)] += g[d * E_ + me * n_local_ + le];
    }
  // 3. Received layout [source rank][local expert] -> expert-major [local expert][source rank].
  std::vector<int64_t> local_counts;
  plan.sorted_from_recv = expert_major_order(
      P, n_local_, [&](int64_t s, int64_t le) { return g[s * E_ + me * n_local_ + le]; }, local_counts);
  const int64_t recv_rows = plan.sorted_from_recv.numel();
  // 4. Tokens and probabilities travel separately (probabilities keep their own dtype).
  x_RH = exchange_forward(x_perm, plan);
  probs_R = exchange_forward(p_perm.reshape({p_perm.numel(), 1}), plan).reshape({recv_rows});
  plan.tokens_per_expert = local_counts;  // from here on: rows per local expert
  plan.R = recv_rows;
}

Tensor AllToAllTokenDispatcher::exchange_forward(const Tensor& local_rows, const DispatchPlan& plan) const {
  const int64_t recv_rows = plan.sorted_from_recv.numel();
  Tensor recv = Tensor::empty({recv_rows, local_rows.cols()}, local_rows.dtype());
  ep_.all_to_all_v(local_rows.reshape({plan.local_rows, local_rows.cols()}), plan.input_splits, recv,
                   plan.output_splits);
  Tensor sorted = Tensor::empty(recv.shape(), recv.dtype());
  gather_rows(recv, plan.sorted_from_recv, sorted);
  return sorted;
}

Tensor AllToAllTokenDispatcher::exchange_backward(const Tensor& sorted_rows, const DispatchPlan& plan) const {
  const int64_t recv_rows = plan.sorted_from_recv.numel(), H = sorted_rows.cols();
  MOE_ASSERT(sorted_rows.rows() == recv_rows);
  Tensor recv = Tensor::empty({recv_rows, H}, sorted_rows.dtype());
  scatter_rows(sorted_rows, plan.sorted_from_recv, recv);
  Tensor local = Tensor::empty({plan.local_rows, H}, sorted_rows.dtype());
  ep_.all_to_all_v(recv, plan.output_splits, local, plan.input_splits);
  return local;
}

Tensor AllToAllTokenDispatcher::combine(const Tensor& y_RH, const DispatchPlan& plan) {
  const Tensor local = exchange_backward(y_RH, plan);
  Tensor y = Tensor::empty({plan.T, y_RH.cols()}, y_RH.dtype());
  sum_rows_per_token(local, plan, y);
  return y;
}

Tensor AllToAllTokenDispatcher::combine_backward(const Tensor& dy_TH, const DispatchPlan& plan) {
  Tensor local = Tensor::empty({plan.local_rows, dy_TH.cols()}, dy_TH.dtype());
  gather_rows(dy_TH, plan.row_token_R, local);
  return exchange_forward(local, plan);
}

void AllToAllTokenDispatcher::dispatch_backward(const Tensor& dx_RH, const Tensor& dprobs_R, const DispatchPlan& plan,
                                                DType probs_dtype, Tensor& dx_TH, Tensor& dprobs_TE) {
  const Tensor dx_local = exchange_backward(dx_RH, plan);
  dx_TH = Tensor::empty({plan.T, dx_RH.cols()}, dx_RH.dtype());
  sum_rows_per_token(dx_local, plan, dx_TH);
  const Tensor dp_local = exchange_backward(dprobs_R.reshape({dprobs_R.numel(), 1}), plan);
  dprobs_TE = Tensor::zeros({plan.T, plan.E}, probs_dtype);
  const int64_t* rte = plan.row_te_R.data<int64_t>();
  for (int64_t i = 0; i < plan.local_rows; i++) dprobs_TE.set_item(rte[i], dp_local.item(i));
}

}  // namespace moecore::moe

// --- AllGather over expert parallelism --------------------------------------------------------------------------

namespace moecore::moe {

Tensor AllGatherTokenDispatcher::gather(const Tensor& t) const {
  Tensor all = Tensor::empty({t.rows() * ep_.size(), t.cols()}, t.dtype());
  ep_.all_gather(t.reshape({t.rows(), t.cols()}), all);
  return all;
}

Tensor AllGatherTokenDispatcher::scatter_sum(const Tensor& t) const {
  Tensor out = Tensor::empty({t.rows() / ep_.size(), t.cols()}, t.dtype());
  ep_.reduce_scatter(t, out);
  return out;
}

void AllGatherTokenDispatcher::dispatch(const Tensor& x_TH, const Tensor& probs_TE, const Tensor& map_TE,
                                        DispatchPlan& plan, Tensor& x_RH, Tensor& probs_R) {
  const int64_t T = map_TE.dim(0), first = ep_.rank() * n_local_;
  const Tensor x_all = gather(x_TH), p_all = gather(probs_TE), m_all = gather(map_TE);
  // This rank's experts: their columns of the gathered map and probabilities.
  const int64_t TA = x_all.rows();
  Tensor m_loc = Tensor::empty({TA, n_local_}, DType::I32), p_loc = Tensor::empty({TA, n_local_}, probs_TE.dtype());
  for (int64_t t = 0; t < TA; t++)
    for (int64_t e = 0; e < n_local_; e++) {
      m_loc.data<int32_t>()[t * n_local_ + e] = m_all.data<int32_t>()[t * E_ + first + e];
      p_loc.set_item(t * n_local_ + e, p_all.item(t * E_ + first + e));
    }
  local_.dispatch(x_all, p_loc, m_loc, plan, x_RH, probs_R);
  plan.T_local = T;
}

Tensor AllGatherTokenDispatcher::combine(const Tensor& y_RH, const DispatchPlan& plan) {
  return scatter_sum(local_.combine(y_RH, plan));
}

Tensor AllGatherTokenDispatcher::combine_backward(const Tensor& dy_TH, const DispatchPlan& plan) {
  return local_.combine_backward(gather(dy_TH), plan);
}

void AllGatherTokenDispatcher::dispatch_backward(const Tensor& dx_RH, const Tensor& dprobs_R, const DispatchPlan& plan,
                                                 DType probs_dtype, Tensor& dx_TH, Tensor& dprobs_TE) {
  Tensor dx_all, dp_loc;
  local_.dispatch_backward(dx_RH, dprobs_R, plan, probs_dtype, dx_all, dp_loc);
  dx_TH = scatter_sum(dx_all);
  // Probability gradients live in this rank's expert columns; the sum over ranks assembles every column.
  const int64_t TA = dp_loc.rows(), first = ep_.rank() * n_local_;
  Tensor dp_all = Tensor::zeros({TA, E_}, probs_dtype);
  for (int64_t t = 0; t < TA; t++)
    for (int64_t e = 0; e < n_local_; e++) dp_all.set_item(t * E_ + first + e, dp_loc.item(t * n_local_ + e));
  dprobs_TE = scatter_sum(dp_all);
}

}  // namespace moecore::moe
