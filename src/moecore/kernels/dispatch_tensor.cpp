// The GEMMs', the elementwise ops' and the optimizer updates' entry points (gemm.h, grouped_gemm.h, elementwise.h,
// adamw_update.h, sgd_update.h): each calls its family's table for the tensors' device (dispatch.h, chosen in
// dispatch.cpp), after the checks both backends share.
#include "moecore/kernels/dispatch.h"
#include "moecore/kernels/gemm.h"

namespace moecore::kernels {

// gemm.h: the backend of the operands (C and B live beside A).
void gemm(const Tensor& A, bool trans_a, const Tensor& B, bool trans_b, Tensor& C, float alpha, float beta) {
  gemm_on(A.device()).gemm(A, trans_a, B, trans_b, C, alpha, beta);
}
void gemm_batched(const Tensor& A, bool trans_a, const Tensor& B, bool trans_b, Tensor& C, float alpha, float beta) {
  gemm_on(A.device()).gemm_batched(A, trans_a, B, trans_b, C, alpha, beta);
}
void grouped_gemm(const Tensor& A_RK, const Tensor& W, bool trans_w, Tensor& C_RN,
                  const std::vector<int64_t>& row_begin, const std::vector<int64_t>& rows,
                  const ExpertWeightPacker* packed) {
  gemm_on(A_RK.device()).grouped_gemm(A_RK, W, trans_w, C_RN, row_begin, rows, packed);
}
void grouped_gemm_wgrad(const Tensor& dY_RN, const Tensor& X_RK, Tensor& dW_ENK, const std::vector<int64_t>& row_begin,
                        const std::vector<int64_t>& rows, float beta) {
  gemm_on(dY_RN.device()).grouped_gemm_wgrad(dY_RN, X_RK, dW_ENK, row_begin, rows, beta);
}
int64_t grouped_gemm_row_align(Device d) {
  return gemm_on(d).grouped_gemm_row_align();
}

// elementwise.h: the backend of the first operand.
void add_(Tensor& a, const Tensor& b) {
  elementwise_on(a.device()).add_(a, b);
}
void add(const Tensor& a, const Tensor& b, Tensor& out) {
  elementwise_on(a.device()).add(a, b, out);
}
void scale_(Tensor& a, double s) {
  elementwise_on(a.device()).scale_(a, s);
}
void fill_(Tensor& a, double v) {
  elementwise_on(a.device()).fill_(a, v);
}
double sum(const Tensor& a) {
  return elementwise_on(a.device()).sum(a);
}
double dot(const Tensor& a, const Tensor& b) {
  return elementwise_on(a.device()).dot(a, b);
}
double sum_squares(const Tensor& a) {
  if (is_half(a.dtype())) return sum_squares(a.to(DType::F32));  // a weight stored in bf16 or f16
  return elementwise_on(a.device()).sum_squares(a);
}
int64_t count_zeros(const Tensor& a) {
  return elementwise_on(a.device()).count_zeros(a);
}
// The segments and shapes are checked here, for both backends.
namespace {
void check_segments(const RowSegments& seg, int64_t rows) {
  MOE_ASSERT(seg.begin.size() == seg.count.size());
  for (size_t e = 0; e < seg.begin.size(); e++)
    MOE_ASSERT_MSG(seg.begin[e] >= 0 && seg.count[e] >= 0 && seg.begin[e] + seg.count[e] <= rows,
                   "segment {}: rows [{}, {}) of {}", e, seg.begin[e], seg.begin[e] + seg.count[e], rows);
}
}  // namespace

void segment_bias_forward(const Tensor& b_EN, const Tensor* w_R, const RowSegments& seg, Tensor& y_RN) {
  const int64_t N = y_RN.cols(), E = static_cast<int64_t>(seg.begin.size());
  MOE_ASSERT_MSG(b_EN.numel() == E * N, "bias {} for {} segments of {} columns", b_EN.shape().str(), E, N);
  MOE_ASSERT(!w_R || w_R->numel() == y_RN.rows());
  check_segments(seg, y_RN.rows());
  elementwise_on(y_RN.device()).segment_bias_forward(b_EN, w_R, seg, y_RN);
}

void segment_bias_backward(const Tensor& dy_RN, const Tensor* w_R, const RowSegments& seg, Tensor& db_EN,
                           const Tensor* b_EN, Tensor* dw_R) {
  const int64_t N = dy_RN.cols(), E = static_cast<int64_t>(seg.begin.size()), R = dy_RN.rows();
  MOE_ASSERT_MSG(db_EN.numel() == E * N, "bias gradient {} for {} segments of {} columns", db_EN.shape().str(), E, N);
  MOE_ASSERT(!w_R || w_R->numel() == R);
  MOE_ASSERT((b_EN == nullptr) == (dw_R == nullptr));
  MOE_ASSERT(!dw_R || (b_EN->numel() == E * N && dw_R->numel() == R));
  check_segments(seg, R);
  elementwise_on(dy_RN.device()).segment_bias_backward(dy_RN, w_R, seg, db_EN, b_EN, dw_R);
}

void copy_cols(const Tensor& src, int64_t src_cols, int64_t src_col, Tensor& dst, int64_t dst_cols, int64_t dst_col,
               int64_t rows, int64_t cols) {
  MOE_ASSERT_MSG(src.dtype() == dst.dtype() && src.device() == dst.device(), "column copy {} on {} into {} on {}",
                 dtype_name(src.dtype()), src.device().str(), dtype_name(dst.dtype()), dst.device().str());
  MOE_ASSERT_MSG(src.numel() == rows * src_cols && dst.numel() == rows * dst_cols && src_col >= 0 && dst_col >= 0 &&
                     cols >= 0 && src_col + cols <= src_cols && dst_col + cols <= dst_cols,
                 "columns [{}, +{}) of {} x {} into columns [{}, +{}) of {} x {}", src_col, cols, rows, src_cols,
                 dst_col, cols, rows, dst_cols);
  elementwise_on(dst.device()).copy_cols(src, src_cols, src_col, dst, dst_cols, dst_col, rows, cols);
}

// One segment of every row.
void add_row_bias_(Tensor& y_TN, const Tensor& b_N) {
  const int64_t begin = 0, rows = y_TN.rows();
  segment_bias_forward(b_N, nullptr, {{&begin, 1}, {&rows, 1}}, y_TN);
}
void accumulate_col_sums(const Tensor& dy_TN, Tensor& db_N) {
  const int64_t begin = 0, rows = dy_TN.rows();
  segment_bias_backward(dy_TN, nullptr, {{&begin, 1}, {&rows, 1}}, db_N);
}

// adamw.h: the backend of the (first) parameter.
void adamw_step(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWParams& hp, int64_t step) {
  optimizer_on(param.device()).adamw_step(param, grad, m, v, hp, step);
}
void adamw_step_multi(std::vector<AdamWTensor>& tensors, const AdamWParams& hp, int64_t step) {
  optimizer_on(tensors.empty() ? Device::cpu() : tensors.front().param.device()).adamw_step_multi(tensors, hp, step);
}
// sgd.h
void sgd_step(Tensor& param, const Tensor& grad, Tensor& buf, const SgdParams& hp) {
  optimizer_on(param.device()).sgd_step(param, grad, buf, hp);
}

}  // namespace moecore::kernels
