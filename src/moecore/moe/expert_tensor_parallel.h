// Expert tensor parallelism, the ETP stage of the dispatcher (reference §3, stages 2b and 4): every ETP rank holds
// all local experts with a 1/ETP share of their FFN columns, so the rows dispatched to any ETP rank are
// all-gathered (variable sizes) and re-sorted expert-major, the experts produce partial sums, and combine
// reduce-scatters them back to the rows' owner in f32. Backward is the exact adjoint: all-gather of the output
// gradients, reduce-scatter of the input and probability gradients. GPU rows: the same movement, the MPI traffic
// host-staged and the re-sorting on the GPU.
#pragma once

#include <vector>

#include "moecore/comm/process_group.h"
#include "moecore/core/tensor.h"

namespace moecore::moe {

struct EtpPlan {
  std::vector<int64_t> rows_per_rank;      // [ETP] rows each ETP rank contributes
  Tensor sorted_from_all;                  // I32: for each expert-major row, its row in the gathered buffer
  std::vector<int64_t> tokens_per_expert;  // [local experts] rows over all ETP ranks
};

class ExpertTensorParallel {
 public:
  ExpertTensorParallel(const comm::ProcessGroup& etp, int64_t local_experts) : etp_(etp), n_local_(local_experts) {}
  // This rank's expert-major rows (tokens_per_expert rows per local expert) -> all ETP ranks' rows, expert-major
  // (inside an expert: source ETP rank order).
  void gather(const Tensor& x_RH, const Tensor& probs_R, const std::vector<int64_t>& tokens_per_expert, EtpPlan& plan,
              Tensor& x_all, Tensor& probs_all) const;
  // The same movement for another row tensor (output gradients in backward).
  Tensor gather_rows_like(const Tensor& rows, const EtpPlan& plan) const;
  // Partial results for all gathered rows -> this rank's rows, summed over ETP (f32; [R] stays [R]).
  Tensor reduce_scatter(const Tensor& all_rows, const EtpPlan& plan) const;

 private:
  const comm::ProcessGroup& etp_;
  int64_t n_local_;
};

}  // namespace moecore::moe
