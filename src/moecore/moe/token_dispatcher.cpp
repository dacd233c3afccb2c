// Local token dispatcher (see token_dispatcher.h).
#include "moecore/moe/token_dispatcher.h"

#include <cstring>

#include "moecore/comm/process_group.h"
#include "moecore/core/cpu.h"
#include "moecore/core/timers.h"
#include "moecore/kernels/cuda/moe_kernels.h"
#include "moecore/nn/stash_bytes.h"

namespace moecore::moe {

namespace {
inline float widen(bf16 v) {
  return bf16_to_float(v);
}
template <typename F>
inline F widen(F v) {
  return v;
}

// out[t] = Σ rows of t in ascending order, in D (bf16 rows S widened as they are read); vectorized per ISA.
template <typename S, typename D>
MOE_TARGET_CLONES void sum_token_rows(const S* src, const int64_t* off, const int32_t* rows, int64_t T, int64_t H,
                                      D* dst) {
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; t++) {
    D* out = dst + t * H;
#pragma omp simd
    for (int64_t h = 0; h < H; h++) out[h] = 0;
    for (int64_t i = off[t]; i < off[t + 1]; i++) {
      const S* in = src + static_cast<int64_t>(rows[i]) * H;
#pragma omp simd
      for (int64_t h = 0; h < H; h++) out[h] += widen(in[h]);
    }
  }
}

// dst[i] = src[at[i]] (gather: 0 where at[i] < 0) or dst[at[i]] = src[i] (scatter: none where at[i] < 0), for
// i < n, in src's dtype when dst has it (else through doubles).
template <bool Scatter>
void move_values(const Tensor& src, const int64_t* at, int64_t n, Tensor& dst) {
  if (src.dtype() != dst.dtype()) {
    for (int64_t i = 0; i < n; i++) {
      if constexpr (Scatter) {
        if (at[i] >= 0) dst.set_item(at[i], src.item(i));
      } else {
        dst.set_item(i, at[i] >= 0 ? src.item(at[i]) : 0.0);
      }
    }
    return;
  }
  MOE_DISPATCH_FLOAT(src.dtype(), F, {
    const F* s = src.data<F>();
    F* d = dst.data<F>();
    for (int64_t i = 0; i < n; i++) {
      if constexpr (Scatter) {
        if (at[i] >= 0) d[at[i]] = s[i];
      } else {
        d[i] = at[i] >= 0 ? s[at[i]] : F(0);
      }
    }
  });
}
void gather_values(const Tensor& src, const int64_t* at, int64_t n, Tensor& dst) {
  move_values<false>(src, at, n, dst);
}
void scatter_values(const Tensor& src, const int64_t* at, int64_t n, Tensor& dst) {
  move_values<true>(src, at, n, dst);
}
}  // namespace

namespace {
// d[r] = bf16(s[tok[r]]) (zero where tok[r] < 0), vectorized as the casts are.
MOE_TARGET_CLONES void gather_rounded_rows(const float* s, const int32_t* tok, int64_t R, int64_t H, bf16* d) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < R; r++) {
    bf16* out = d + r * H;
    if (tok[r] < 0) {
      std::fill_n(out, H, bf16{0});
      continue;
    }
    const float* in = s + tok[r] * H;
#pragma omp simd
    for (int64_t h = 0; h < H; h++) out[h] = float_to_bf16(in[h]);
  }
}
}  // namespace

void gather_rows(const Tensor& src_TH, const Tensor& row_token_R, Tensor& dst_RH) {
  TimerScope timer("moe-permute", 2);  // moecore's: token permutation copies (bench train's phase table)
  if (src_TH.device().is_cuda())
    return kernels::cuda::moe_gather_rows(src_TH.as_dtype(dst_RH.dtype()), row_token_R, dst_RH);
  const int64_t R = row_token_R.numel(), H = src_TH.cols();
  MOE_ASSERT(dst_RH.rows() == R && dst_RH.cols() == H);
  const int32_t* tok = row_token_R.data<int32_t>();
  if (dst_RH.dtype() != src_TH.dtype()) {
    MOE_ASSERT_MSG(src_TH.dtype() == DType::F32 && dst_RH.dtype() == DType::BF16, "rows gathered from {} into {}",
                   dtype_name(src_TH.dtype()), dtype_name(dst_RH.dtype()));
    return gather_rounded_rows(src_TH.data<float>(), tok, R, H, dst_RH.data<bf16>());
  }
  const size_t bytes = static_cast<size_t>(H) * dtype_size(src_TH.dtype());
  const char* s = static_cast<const char*>(src_TH.raw());
  char* d = static_cast<char*>(dst_RH.raw());
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < R; r++) {
    if (tok[r] < 0)
      std::memset(d + r * bytes, 0, bytes);  // a gap row of the padded layout
    else
      std::memcpy(d + r * bytes, s + tok[r] * bytes, bytes);
  }
}

void scatter_rows(const Tensor& src_RH, const Tensor& idx_R, Tensor& dst) {
  TimerScope timer("moe-permute", 2);
  if (src_RH.device().is_cuda()) return kernels::cuda::moe_scatter_rows(src_RH, idx_R, dst);
  const int64_t R = idx_R.numel(), H = src_RH.cols();
  MOE_ASSERT(src_RH.rows() == R && dst.cols() == H && dst.dtype() == src_RH.dtype());
  const size_t bytes = static_cast<size_t>(H) * dtype_size(src_RH.dtype());
  const char* s = static_cast<const char*>(src_RH.raw());
  char* d = static_cast<char*>(dst.raw());
  const int32_t* idx = idx_R.data<int32_t>();
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < R; r++)
    if (idx[r] >= 0) std::memcpy(d + idx[r] * bytes, s + r * bytes, bytes);
}

int64_t align_up(int64_t n, int64_t align) {
  return (n + align - 1) / align * align;
}

Tensor padded_rows_empty(int64_t rows, int64_t experts, int64_t align, int64_t padded, int64_t C, DType dtype,
                         Device device) {
  const int64_t capacity = align > 1 ? rows + experts * (align - 1) : rows;
  MOE_ASSERT(padded <= capacity);
  return Tensor::empty({capacity, C}, dtype, device).slice(0, padded);
}

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

Tensor scatter_dprobs(const Tensor& dprobs_rows, const DispatchPlan& plan, DType probs_dtype) {
  const int64_t n = plan.row_tk_R.numel();
  MOE_ASSERT_MSG(dprobs_rows.numel() == n, "{} row probability gradients for {} permuted rows", dprobs_rows.numel(), n);
  if (dprobs_rows.device().is_cuda()) {
    Tensor d = Tensor::empty({plan.T, plan.K}, probs_dtype, dprobs_rows.device());
    scatter_dprobs_cuda(dprobs_rows, plan.row_tk_R, d);
    return d;
  }
  Tensor d = Tensor::zeros({plan.T, plan.K}, probs_dtype);
  scatter_values(dprobs_rows, plan.row_tk_R.data<int64_t>(), n, d);
  return d;
}

DType row_sum_dtype(DType rows) {
  return rows == DType::BF16 ? DType::F32 : rows;
}

void sum_rows_per_token(const Tensor& src_RH, const DispatchPlan& plan, Tensor& dst_TH) {
  TimerScope timer("moe-permute", 2);
  if (src_RH.device().is_cuda())
    return kernels::cuda::moe_sum_rows_per_token(src_RH, plan.token_offsets_T1, plan.token_rows, dst_TH);
  const int64_t T = plan.T, H = src_RH.cols();
  MOE_ASSERT(dst_TH.rows() == T && dst_TH.cols() == H && dst_TH.dtype() == row_sum_dtype(src_RH.dtype()));
  const int64_t* off = plan.token_offsets_T1.data<int64_t>();
  const int32_t* rows = plan.token_rows.data<int32_t>();
  if (src_RH.dtype() == DType::BF16) return sum_token_rows(src_RH.data<bf16>(), off, rows, T, H, dst_TH.data<float>());
  MOE_DISPATCH_FLOAT(src_RH.dtype(), F, { sum_token_rows(src_RH.data<F>(), off, rows, T, H, dst_TH.data<F>()); });
}

void LocalTokenDispatcher::dispatch(const Tensor& x_TH, const RoutedTokens& routed, DispatchPlan& plan, Tensor& x_RH,
                                    Tensor& probs_R) {
  permute(x_TH, routed.idx_TK, routed.probs_TK, routed.pad_capacity, routed.idx_TK.dim(0), plan.row_align, plan, x_RH,
          probs_R);
}

void LocalTokenDispatcher::permute(const Tensor& x_TH, const Tensor& idx_TK, const Tensor& probs_TK,
                                   int64_t pad_capacity, int64_t block, int64_t row_align, DispatchPlan& plan,
                                   Tensor& x_RH, Tensor& probs_R) const {
  if (x_TH.device().is_cuda())
    return permute_cuda(x_TH.as_dtype(plan.rows_dtype_for(x_TH)), idx_TK, probs_TK, pad_capacity, block, row_align,
                        plan, x_RH, probs_R);
  const int64_t T = idx_TK.dim(0), K = idx_TK.dim(1), E = E_;
  MOE_ASSERT(row_align >= 1);
  MOE_ASSERT(idx_TK.dtype() == DType::I32 && x_TH.rows() == T && probs_TK.numel() == T * K);
  MOE_ASSERT(pad_capacity == 0 || (block > 0 && T % block == 0));
  const int32_t* id = idx_TK.data<int32_t>();
  auto mine = [&](int64_t i) { return id[i] >= 0 && id[i] < E; };
  // j of token t's choice of expert e, or −1 (an expert appears at most once among a token's K choices).
  auto choice = [&](int64_t t, int64_t e) {
    for (int64_t j = 0; j < K; j++)
      if (id[t * K + j] == e) return j;
    return int64_t{-1};
  };
  plan.T = T;
  plan.E = E;
  plan.K = K;
  plan.tokens_per_expert.assign(static_cast<size_t>(E), 0);
  plan.token_offsets_T1 = Tensor::zeros({T + 1}, DType::I64);
  int64_t* off = plan.token_offsets_T1.data<int64_t>();
  auto& tpe = plan.tokens_per_expert;
  // Rows per expert and per token (off[t + 1]); under padding, each expert is filled to pad_capacity per block
  // with the earliest tokens that have no row for it.
  for (int64_t i = 0; i < T * K; i++)
    if (mine(i)) {
      tpe[static_cast<size_t>(id[i])]++;
      off[i / K + 1]++;
    }
  auto pad_walk = [&](int64_t e, auto&& row) {  // calls row(t, j or −1) for expert e's rows, ascending t
    for (int64_t b0 = 0; b0 < T; b0 += block) {
      int64_t have = 0;
      for (int64_t t = b0; t < b0 + block; t++) have += choice(t, e) >= 0;
      MOE_ASSERT(have <= pad_capacity);
      int64_t need = pad_capacity - have;
      for (int64_t t = b0; t < b0 + block; t++) {
        const int64_t j = choice(t, e);
        if (j >= 0) {
          row(t, j);
        } else if (need > 0) {
          row(t, int64_t{-1});
          need--;
        }
      }
    }
  };
  if (pad_capacity > 0)
    for (int64_t e = 0; e < E; e++)
      pad_walk(e, [&](int64_t t, int64_t j) {
        if (j < 0) {
          tpe[static_cast<size_t>(e)]++;
          off[t + 1]++;
        }
      });
  int64_t R = 0, Rp = 0;  // rows, and rows in the padded layout
  for (int64_t c : tpe) R += c, Rp += align_up(c, row_align);
  plan.R = Rp;
  for (int64_t t = 0; t < T; t++) off[t + 1] += off[t];
  // Sized for the most rows the padded layout can take: the same allocation every step however the rows fall.
  auto rows_empty = [&](int64_t C, DType dt) { return padded_rows_empty(R, E, row_align, Rp, C, dt); };
  plan.row_token_R = rows_empty(1, DType::I32).reshape({Rp});
  plan.row_tk_R = rows_empty(1, DType::I64).reshape({Rp});
  plan.token_rows = Tensor::empty({R}, DType::I32);
  int32_t* rt = plan.row_token_R.data<int32_t>();
  int64_t* rtk = plan.row_tk_R.data<int64_t>();
  // Expert-major, ascending token inside an expert; expert e's rows start at pad_start[e] (gap rows: −1).
  std::vector<int64_t> pad_start(static_cast<size_t>(E) + 1, 0);
  for (int64_t e = 0; e < E; e++)
    pad_start[static_cast<size_t>(e + 1)] =
        pad_start[static_cast<size_t>(e)] + align_up(tpe[static_cast<size_t>(e)], row_align);
  for (int64_t e = 0; e < E; e++)
    for (int64_t r = pad_start[static_cast<size_t>(e)] + tpe[static_cast<size_t>(e)];
         r < pad_start[static_cast<size_t>(e + 1)]; r++)
      rt[r] = -1, rtk[r] = -1;
  if (pad_capacity > 0) {
    for (int64_t e = 0; e < E; e++) {
      int64_t r = pad_start[static_cast<size_t>(e)];
      pad_walk(e, [&](int64_t t, int64_t j) {
        rt[r] = static_cast<int32_t>(t);
        rtk[r] = j >= 0 ? t * K + j : -1;
        r++;
      });
      MOE_ASSERT(r == pad_start[static_cast<size_t>(e)] + tpe[static_cast<size_t>(e)]);
    }
  } else {  // counting sort: plan.expert_offsets[e] runs from expert e's first row to its end
    auto& eo = plan.expert_offsets;
    eo.assign(pad_start.begin(), pad_start.end());
    for (int64_t i = 0; i < T * K; i++)
      if (mine(i)) {
        const int64_t r = eo[static_cast<size_t>(id[i])]++;
        rt[r] = static_cast<int32_t>(i / K);
        rtk[r] = i;
      }
  }
  // Each token's rows in ascending expert order (rows are expert-major).
  plan.token_cursor_T = Tensor::empty({std::max<int64_t>(T, 1)}, DType::I64);
  int64_t* cur = plan.token_cursor_T.data<int64_t>();
  std::copy(off, off + T, cur);
  int32_t* trows = plan.token_rows.data<int32_t>();
  for (int64_t r = 0; r < Rp; r++)
    if (rt[r] >= 0) trows[cur[rt[r]]++] = static_cast<int32_t>(r);
  const DType rows_t = plan.rows_dtype_for(x_TH);
  x_RH = rows_empty(x_TH.cols(), rows_t);
  gather_rows(x_TH, plan.row_token_R, x_RH);
  probs_R = rows_empty(1, row_sum_dtype(rows_t)).reshape({Rp});
  gather_values(probs_TK, rtk, Rp, probs_R);
}

Tensor LocalTokenDispatcher::combine(const Tensor& y_RH, const DispatchPlan& plan) {
  Tensor y = Tensor::empty({plan.T, y_RH.cols()}, row_sum_dtype(y_RH.dtype()), y_RH.device());
  sum_rows_per_token(y_RH, plan, y);
  return y;
}

Tensor LocalTokenDispatcher::combine_backward(const Tensor& dy_TH, const DispatchPlan& plan) {
  Tensor d = padded_rows_empty(plan.token_rows.numel(), plan.E, plan.row_align, plan.R, dy_TH.cols(),
                               plan.rows_dtype_for(dy_TH), dy_TH.device());
  gather_rows(dy_TH, plan.row_token_R, d);
  return d;
}

void LocalTokenDispatcher::dispatch_backward(const Tensor& dx_RH, const Tensor& dprobs_R, const DispatchPlan& plan,
                                             DType probs_dtype, Tensor& dx_TH, Tensor& dprobs_TK) {
  dx_TH = Tensor::empty({plan.T, dx_RH.cols()}, row_sum_dtype(dx_RH.dtype()), dx_RH.device());
  sum_rows_per_token(dx_RH, plan, dx_TH);
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
  // 1. Local permute over all E experts: rows for EP rank d are contiguous (experts d·n_le .. (d+1)·n_le − 1).
  Tensor x_perm, p_perm;
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
  if (x_TH.device().is_cuda()) plan.sorted_from_recv = plan.sorted_from_recv.to(x_TH.device());
  plan.recv_rows = 0;
  for (int64_t n : plan.output_splits) plan.recv_rows += n;
  plan.R = plan.sorted_from_recv.numel();
  // 4. Tokens and probabilities travel separately (probabilities keep their own dtype).
  x_RH = exchange_forward(x_perm, plan);
  probs_R = exchange_forward(p_perm.reshape({p_perm.numel(), 1}), plan).reshape({plan.R});
}

Tensor AllToAllTokenDispatcher::exchange_forward(const Tensor& local_rows, const DispatchPlan& plan) const {
  const int64_t C = local_rows.cols();
  Tensor recv = Tensor::empty({plan.recv_rows, C}, local_rows.dtype(), local_rows.device());
  // moecore's MoE timers (core/timers.h) by direction: token ranks to expert ranks is the dispatch (its forward,
  // and combine's backward), back is the combine.
  TimerScope timer("moe-dispatch-all-to-all", 2);
  ep_.all_to_all_v(local_rows.reshape({plan.local_rows, local_rows.cols()}), plan.input_splits, recv,
                   plan.output_splits);
  Tensor sorted = padded_rows_empty(plan.recv_rows, n_local_, plan.row_align, plan.R, C, recv.dtype(), recv.device());
  gather_rows(recv, plan.sorted_from_recv, sorted);
  return sorted;
}

Tensor AllToAllTokenDispatcher::exchange_backward(const Tensor& sorted_rows, const DispatchPlan& plan) const {
  const int64_t H = sorted_rows.cols();
  MOE_ASSERT(sorted_rows.rows() == plan.R);
  const Device d = sorted_rows.device();
  Tensor recv = Tensor::empty({plan.recv_rows, H}, sorted_rows.dtype(), d);
  scatter_rows(sorted_rows, plan.sorted_from_recv, recv);
  Tensor local = Tensor::empty({plan.local_rows, H}, sorted_rows.dtype(), d);
  TimerScope timer("moe-combine-all-to-all", 2);
  ep_.all_to_all_v(recv, plan.output_splits, local, plan.input_splits);
  return local;
}

Tensor AllToAllTokenDispatcher::combine(const Tensor& y_RH, const DispatchPlan& plan) {
  const Tensor local = exchange_backward(y_RH, plan);
  Tensor y = Tensor::empty({plan.T, y_RH.cols()}, row_sum_dtype(y_RH.dtype()), y_RH.device());
  sum_rows_per_token(local, plan, y);
  return y;
}

Tensor AllToAllTokenDispatcher::combine_backward(const Tensor& dy_TH, const DispatchPlan& plan) {
  Tensor local = Tensor::empty({plan.local_rows, dy_TH.cols()}, plan.rows_dtype_for(dy_TH), dy_TH.device());
  gather_rows(dy_TH, plan.row_token_R, local);
  return exchange_forward(local, plan);
}

void AllToAllTokenDispatcher::dispatch_backward(const Tensor& dx_RH, const Tensor& dprobs_R, const DispatchPlan& plan,
                                                DType probs_dtype, Tensor& dx_TH, Tensor& dprobs_TK) {
  const Tensor dx_local = exchange_backward(dx_RH, plan);
  dx_TH = Tensor::empty({plan.T, dx_RH.cols()}, row_sum_dtype(dx_RH.dtype()), dx_RH.device());
  sum_rows_per_token(dx_local, plan, dx_TH);
  const Tensor dp_local = exchange_backward(dprobs_R.reshape({dprobs_R.numel(), 1}), plan);
  dprobs_TK = scatter_dprobs(dp_local, plan, probs_dtype);
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
