// Grouped expert GEMMs on the CPU (see grouped_gemm.h): each expert's rows in the fewest chunks of at most kRowChunk
// rows, all of about one size, as oneDNN products on views of the rows and the expert's weight. With row counts a
// multiple of kRowAlign every chunk is one of a small set of fixed-shape primitives made by grouped_gemm_prepare
// (oneDNN's run-time-shaped matmuls are slower than fixed-shape ones: docs/performance.md, "Figures from code
// comments"). Weight gradients reduce over such chunks of at most kWgradChunk rows in a fixed order.
#include <algorithm>

#include "moecore/kernels/backends.h"
#include "moecore/kernels/cpu/kernels.h"

namespace moecore::kernels {

namespace {
constexpr int64_t kRowAlign = 32, kRowChunk = 2048, kWgradChunk = 2048;

int64_t align_rows(int64_t n) {
  return (n + kRowAlign - 1) / kRowAlign * kRowAlign;
}

// The chunk size that splits n rows into the fewest chunks of at most `most` rows, all of about one size (multiples
// of kRowAlign): 1,056 rows go as 544 + 512, not 1,024 + 32, whose thin product (or, for a weight gradient, a K = 32
// pass over the whole f32 gradient) runs far below the GEMM rate.
int64_t even_chunk(int64_t n, int64_t most) {
  const int64_t chunks = std::max<int64_t>((n + most - 1) / most, 1);
  return align_rows((n + chunks - 1) / chunks);
}

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

void grouped_gemm_prepare(int64_t N, int64_t K, bool trans_w, DType dtype, DType out, bool packed) {
  for (int64_t m = kRowAlign; m <= kRowChunk; m += kRowAlign) {
    gemm_prepare(m, N, K, false, trans_w, dtype, 1.0f, 0.0f, out);
    if (packed) gemm_prepare_packed(m, N, K, trans_w, 0.0f, out);
  }
}

void grouped_gemm_wgrad_prepare(int64_t N, int64_t K, DType dtype) {
  for (int64_t k = kRowAlign; k <= kWgradChunk; k += kRowAlign) gemm_prepare(N, K, k, true, false, dtype, 1.0f, 1.0f);
}

namespace cpu {

int64_t grouped_gemm_row_align() {
  return kRowAlign;
}

void grouped_gemm(const Tensor& A_RK, const Tensor& W, bool trans_w, Tensor& C_RN,
                  const std::vector<int64_t>& row_begin, const std::vector<int64_t>& rows,
                  const ExpertWeightPacker* packed) {
  check_groups(W, row_begin, rows, A_RK.rows());
  MOE_ASSERT(C_RN.rows() == A_RK.rows() && A_RK.dtype() == W.dtype());
  MOE_ASSERT(!is_half(C_RN.dtype()) || A_RK.dtype() == C_RN.dtype());
  for (size_t e = 0; e < rows.size(); e++) {
    const int64_t n = rows[e], r0 = row_begin[e];
    if (n == 0) continue;
    const PackedWeight w = packed ? (*packed)(static_cast<int64_t>(e), kRowChunk)
                                  : PackedWeight{expert_matrix(W, static_cast<int64_t>(e)), trans_w, {}, -1};
    const int64_t step = even_chunk(n, kRowChunk);
    for (int64_t r = 0; r < n; r += step) {
      const int64_t m = std::min(step, n - r);
      Tensor c = C_RN.slice(r0 + r, m);
      kernels::gemm(A_RK.slice(r0 + r, m), w, c);
    }
  }
}

void grouped_gemm_wgrad(const Tensor& dY_RN, const Tensor& X_RK, Tensor& dW_ENK, const std::vector<int64_t>& row_begin,
                        const std::vector<int64_t>& rows, float beta) {
  check_groups(dW_ENK, row_begin, rows, dY_RN.rows());
  MOE_ASSERT(X_RK.rows() == dY_RN.rows() && X_RK.dtype() == dY_RN.dtype() && !is_half(dW_ENK.dtype()));
  for (size_t e = 0; e < rows.size(); e++) {
    const int64_t n = rows[e], r0 = row_begin[e];
    if (n == 0) continue;
    Tensor dw = expert_matrix(dW_ENK, static_cast<int64_t>(e));
    const int64_t step = even_chunk(n, kWgradChunk);
    for (int64_t r = 0; r < n; r += step) {
      const int64_t k = std::min(step, n - r);
      gemm(dY_RN.slice(r0 + r, k), true, X_RK.slice(r0 + r, k), false, dw, 1.0f, r == 0 ? beta : 1.0f);
    }
  }
}

}  // namespace cpu
}  // namespace moecore::kernels

namespace moecore::kernels::cpu {

// This backend's table (kernels/backends.h).
const GemmKernels kGemmKernels{gemm, gemm_batched, grouped_gemm, grouped_gemm_wgrad, grouped_gemm_row_align};

}  // namespace moecore::kernels::cpu
