// Small elementwise and reduction helpers shared by modules: residual adds, scaling, deterministic sums.
// Reductions accumulate in f64 over fixed chunks in a fixed order, so results do not depend on the thread count.
#pragma once

#include "moecore/core/tensor.h"

namespace moecore::kernels {

void add_(Tensor& a, const Tensor& b);                    // a += b
void add(const Tensor& a, const Tensor& b, Tensor& out);  // out = a + b (out may alias a or b)
void scale_(Tensor& a, double s);                         // a *= s
void fill_(Tensor& a, double v);
double sum(const Tensor& a);
double dot(const Tensor& a, const Tensor& b);
double sum_squares(const Tensor& a);
// Entries exactly zero (Megatron's count_zeros_fp32 of a gradient).
int64_t count_zeros(const Tensor& a);

}  // namespace moecore::kernels

namespace moecore::kernels {
// y_TN += b_N on every row.
void add_row_bias_(Tensor& y_TN, const Tensor& b_N);
// db_N += Σ_rows dy_TN (column sums, fixed order).
void accumulate_col_sums(const Tensor& dy_TN, Tensor& db_N);
}  // namespace moecore::kernels
