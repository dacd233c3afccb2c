// Embedding lookup: y[t] = W[id[t]]. Backward scatters dy into dW (accumulated), in token order for determinism.
#pragma once

#include "moecore/core/tensor.h"

namespace moecore::kernels {

// ids_T [T] (i32 or i64), w_VH [V, H] -> y_TH [T, H]. An id outside [0, V) is a user error (data/vocab mismatch).
void embedding_forward(const Tensor& ids_T, const Tensor& w_VH, Tensor& y_TH);
// dy_TH -> dw_VH (accumulated).
void embedding_backward(const Tensor& dy_TH, const Tensor& ids_T, Tensor& dw_VH);

}  // namespace moecore::kernels
