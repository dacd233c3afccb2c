// Small elementwise and reduction helpers shared by modules: residual adds, scaling, deterministic sums.
// Reductions accumulate in f64 over fixed chunks in a fixed order, so results do not depend on the thread count.
#pragma once

#include <span>

#include "moecore/core/tensor.h"

namespace moecore::kernels {

void add_(Tensor& a, const Tensor& b);                    // a += b
void add(const Tensor& a, const Tensor& b, Tensor& out);  // out = a + b (out may alias a or b)
void scale_(Tensor& a, double s);                         // a *= s
void fill_(Tensor& a, double v);
double sum(const Tensor& a);
double dot(const Tensor& a, const Tensor& b);
double sum_squares(const Tensor& a);  // f32 or f64 (a bf16 tensor: read as f32)
// Entries exactly zero (Megatron's count_zeros_fp32 of a gradient).
int64_t count_zeros(const Tensor& a);

}  // namespace moecore::kernels

namespace moecore::kernels {
// The rows of an [R, N] tensor in segments, such as each expert's rows: segment e is rows [begin[e], begin[e] +
// count[e]). Segments do not overlap; rows outside every segment are neither read nor written.
struct RowSegments {
  std::span<const int64_t> begin, count;
};

// A bias per segment, each row's scaled by that row's weight (Megatron's expert fc2 bias, scaled by the routing
// probability; no weights: the plain bias of fc1 or of a linear layer):
//   y_RN[r] += b_EN[e] · w_R[r]   for every row r of segment e   (w_R null: w = 1).
// b_EN and w_R have the computation's dtype (f32 or f64); y_RN that dtype, or bf16 with f32 (rounded as written).
void segment_bias_forward(const Tensor& b_EN, const Tensor* w_R, const RowSegments& seg, Tensor& y_RN);
// Its adjoint, accumulated: ∂y[r, j]/∂b[e, j] = w_r and ∂y[r, j]/∂w_r = b[e, j], so
//   db_EN[e] += Σ_{r ∈ e} w_r · dy_RN[r]   (each column block's rows summed in order: deterministic)
//   dw_R[r]  += dy_RN[r] · b_EN[e]         (only with b_EN and dw_R given)
// dy_RN as y_RN above (bf16 widened as it is read); db_EN, w_R and dw_R in the computation's dtype.
void segment_bias_backward(const Tensor& dy_RN, const Tensor* w_R, const RowSegments& seg, Tensor& db_EN,
                           const Tensor* b_EN = nullptr, Tensor* dw_R = nullptr);

// One segment of every row, no weights: y_TN += b_N on every row; db_N += Σ_rows dy_TN.
void add_row_bias_(Tensor& y_TN, const Tensor& b_N);
void accumulate_col_sums(const Tensor& dy_TN, Tensor& db_N);

// A block of columns copied between row-major matrices of one dtype on one device, each seen as [rows, its columns]:
//   dst[r, dst_col + j] = src[r, src_col + j]   for r < rows, j < cols   (bytes: exact for every dtype)
void copy_cols(const Tensor& src, int64_t src_cols, int64_t src_col, Tensor& dst, int64_t dst_cols, int64_t dst_col,
               int64_t rows, int64_t cols);
// The entry points above as one backend implements them (kernels/cpu/elementwise.cpp, kernels/cuda/kernels.cpp),
// each with the signature of the op it is named after; kernels/dispatch.cpp picks the table of the first operand's
// device (copy_cols: the destination's).
struct ElementwiseKernels {
  void (*add_)(Tensor& a, const Tensor& b);
  void (*add)(const Tensor& a, const Tensor& b, Tensor& out);
  void (*scale_)(Tensor& a, double s);
  void (*fill_)(Tensor& a, double v);
  double (*sum)(const Tensor& a);
  double (*dot)(const Tensor& a, const Tensor& b);
  double (*sum_squares)(const Tensor& a);
  int64_t (*count_zeros)(const Tensor& a);
  void (*segment_bias_forward)(const Tensor& b_EN, const Tensor* w_R, const RowSegments& seg, Tensor& y_RN);
  void (*segment_bias_backward)(const Tensor& dy_RN, const Tensor* w_R, const RowSegments& seg, Tensor& db_EN,
                                const Tensor* b_EN, Tensor* dw_R);
  void (*copy_cols)(const Tensor& src, int64_t src_cols, int64_t src_col, Tensor& dst, int64_t dst_cols,
                    int64_t dst_col, int64_t rows, int64_t cols);
};

}  // namespace moecore::kernels
