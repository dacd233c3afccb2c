// Grouped expert GEMMs on the CPU (see grouped_gemm.h): one oneDNN product per expert with rows, on views of the
// expert's rows and weight.
#include "moecore/kernels/cpu/kernels.h"

namespace moecore::kernels::cpu {

namespace {
// W_e as a matrix: [E, a, b] → [a, b].
Tensor expert_matrix(const Tensor& W, int64_t e) {
  return W.slice(e, 1).reshape({W.dim(1), W.dim(2)});
}

void check_groups(const Tensor& W, const std::vector<int64_t>& row_begin, const std::vector<int64_t>& rows, int64_t R) {
  MOE_ASSERT_MSG(W.ndim() == 3 && static_cast<size_t>(W.dim(0)) == rows.size() && row_begin.size() == rows.size(),
                 "weights {} for {} experts", W.shape().str(), rows.size());
  for (size_t e = 0; e < rows.size(); e++)
    MOE_ASSERT_MSG(row_begin[e] >= 0 && rows[e] >= 0 && row_begin[e] + rows[e] <= R, "expert {}: rows [{}, {}) of {}",
                   e, row_begin[e], row_begin[e] + rows[e], R);
}
}  // namespace

void grouped_gemm(const Tensor& A_RK, const Tensor& W, bool trans_w, Tensor& C_RN,
                  const std::vector<int64_t>& row_begin, const std::vector<int64_t>& rows) {
  check_groups(W, row_begin, rows, A_RK.rows());
  MOE_ASSERT(C_RN.rows() == A_RK.rows() && A_RK.dtype() == W.dtype());
  MOE_ASSERT(C_RN.dtype() == DType::F32 || (C_RN.dtype() == DType::BF16 && A_RK.dtype() == DType::BF16));
  for (size_t e = 0; e < rows.size(); e++) {
    if (rows[e] == 0) continue;
    Tensor c = C_RN.slice(row_begin[e], rows[e]);
    gemm(A_RK.slice(row_begin[e], rows[e]), false, expert_matrix(W, static_cast<int64_t>(e)), trans_w, c, 1.0f, 0.0f);
  }
}

void grouped_gemm_wgrad(const Tensor& dY_RN, const Tensor& X_RK, Tensor& dW_ENK, const std::vector<int64_t>& row_begin,
                        const std::vector<int64_t>& rows) {
  check_groups(dW_ENK, row_begin, rows, dY_RN.rows());
  MOE_ASSERT(X_RK.rows() == dY_RN.rows() && X_RK.dtype() == dY_RN.dtype() && dW_ENK.dtype() == DType::F32);
  for (size_t e = 0; e < rows.size(); e++) {
    if (rows[e] == 0) continue;
    Tensor dw = expert_matrix(dW_ENK, static_cast<int64_t>(e));
    gemm(dY_RN.slice(row_begin[e], rows[e]), true, X_RK.slice(row_begin[e], rows[e]), false, dw, 1.0f, 1.0f);
  }
}

}  // namespace moecore::kernels::cpu
