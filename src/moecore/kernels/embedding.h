// Embedding lookup: y[t] = W[id[t]]. Backward scatters dy into dW (accumulated), in token order for determinism.
#pragma once

#include "moecore/core/tensor.h"

namespace moecore::kernels {

// ids_T [T] (i32 or i64), w_VH [V, H] -> y_TH [T, H]. An id outside [0, V) is a user error (data/vocab mismatch).
// Vocabulary-parallel form: w_VH holds rows [vocab_start, vocab_start + V) of a table of vocab_total rows; ids
// outside this rank's rows give zero rows (the sum over ranks is the lookup).
void embedding_forward(const Tensor& ids_T, const Tensor& w_VH, Tensor& y_TH, int64_t vocab_start = 0,
                       int64_t vocab_total = 0);
// dy_TH -> dw_VH (accumulated); ids outside [vocab_start, vocab_start + V) are skipped.
void embedding_backward(const Tensor& dy_TH, const Tensor& ids_T, Tensor& dw_VH, int64_t vocab_start = 0);

// The entry points above as one backend implements them (kernels/cpu/embedding.cpp, kernels/cuda/kernels.cpp);
// kernels/dispatch.cpp picks the table of the embedding table's device.
struct EmbeddingKernels {
  void (*forward)(const Tensor& ids_T, const Tensor& w_VH, Tensor& y_TH, int64_t vocab_start, int64_t vocab_total);
  void (*backward)(const Tensor& dy_TH, const Tensor& ids_T, Tensor& dw_VH, int64_t vocab_start);
};

}  // namespace moecore::kernels
