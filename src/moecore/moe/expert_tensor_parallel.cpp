// Expert tensor parallelism (see expert_tensor_parallel.h).
#include "moecore/moe/expert_tensor_parallel.h"

#include "moecore/kernels/moe_permute.h"
#include "moecore/moe/token_dispatcher.h"

namespace moecore::moe {

namespace {
Tensor as_rows(const Tensor& t) {
  return t.ndim() == 1 ? t.reshape({t.numel(), 1}) : t;
}
}  // namespace

void ExpertTensorParallel::gather(const Tensor& x_RH, const Tensor& probs_R,
                                  const std::vector<int64_t>& tokens_per_expert, EtpPlan& plan, Tensor& x_all,
                                  Tensor& probs_all) const {
  const int64_t P = etp_.size(), n = n_local_;
  MOE_ASSERT(static_cast<int64_t>(tokens_per_expert.size()) == n);
  Tensor mine = Tensor::empty({n}, DType::I64), counts = Tensor::empty({P, n}, DType::I64);
  for (int64_t e = 0; e < n; e++) mine.data<int64_t>()[e] = tokens_per_expert[static_cast<size_t>(e)];
  etp_.all_gather(mine, counts);
  const int64_t* c = counts.data<int64_t>();
  plan.rows_per_rank.assign(static_cast<size_t>(P), 0);
  for (int64_t r = 0; r < P; r++)
    for (int64_t e = 0; e < n; e++) plan.rows_per_rank[static_cast<size_t>(r)] += c[r * n + e];
  // Gathered layout [source rank][local expert] -> expert-major [local expert][source rank].
  plan.sorted_from_all = expert_major_order(P, n, c, n, 0, plan.tokens_per_expert);
  plan.sorted_from_all = plan.sorted_from_all.to(x_RH.device());
  const int64_t total = plan.sorted_from_all.numel();
  x_all = gather_rows_like(x_RH, plan);
  probs_all = gather_rows_like(probs_R, plan).reshape({total});
}

Tensor ExpertTensorParallel::gather_rows_like(const Tensor& rows_in, const EtpPlan& plan) const {
  const Tensor rows = as_rows(rows_in);
  const int64_t total = plan.sorted_from_all.numel();
  Tensor all = Tensor::empty({total, rows.cols()}, rows.dtype(), rows.device());
  etp_.all_gather_v(rows, all, plan.rows_per_rank);  // GPU rows travel through host copies (ProcessGroup)
  Tensor sorted = Tensor::empty(all.shape(), all.dtype(), all.device());
  kernels::moe_gather_rows(all, plan.sorted_from_all, sorted);
  return rows_in.ndim() == 1 ? sorted.reshape({total}) : sorted;
}

Tensor ExpertTensorParallel::reduce_scatter(const Tensor& all_in, const EtpPlan& plan) const {
  Tensor sorted = as_rows(all_in);
  if (is_half(sorted.dtype())) sorted = sorted.to(DType::F32);
  Tensor all = Tensor::empty(sorted.shape(), sorted.dtype(), sorted.device());
  kernels::moe_scatter_rows(sorted, plan.sorted_from_all, all);
  const int64_t mine = plan.rows_per_rank[static_cast<size_t>(etp_.rank())];
  Tensor out = Tensor::empty({mine, all.cols()}, all.dtype(), all.device());
  etp_.reduce_scatter_v(all, out, plan.rows_per_rank);
  return all_in.ndim() == 1 ? out.reshape({mine}) : out;
}

}  // namespace moecore::moe
