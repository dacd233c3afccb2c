// Embedding (see embedding.h). Backward: dW[v] += Σ_{t: id[t]=v} dy[t]. Threads split the hidden dimension, and
// each walks tokens in order, so repeated ids sum in a fixed order whatever the thread count.

#include <cstring>

#include "moecore/kernels/backends.h"
#include "moecore/kernels/cpu/kernels.h"

namespace moecore::kernels::cpu {

namespace {
inline int64_t id_at(const Tensor& ids, int64_t t) {
  return ids.dtype() == DType::I32 ? ids.data<int32_t>()[t] : ids.data<int64_t>()[t];
}
}  // namespace

void embedding_forward(const Tensor& ids_T, const Tensor& w_VH, Tensor& y_TH, int64_t vocab_start,
                       int64_t vocab_total) {
  const int64_t T_ = ids_T.numel(), VL = w_VH.dim(0), H = w_VH.dim(1);
  const int64_t V = vocab_total > 0 ? vocab_total : VL;
  MOE_ASSERT(ids_T.dtype() == DType::I32 || ids_T.dtype() == DType::I64);
  MOE_ASSERT(y_TH.rows() == T_ && y_TH.cols() == H && y_TH.dtype() == w_VH.dtype());
  for (int64_t t = 0; t < T_; t++) {
    const int64_t id = id_at(ids_T, t);
    MOE_CHECK(id >= 0 && id < V,
              "token id {} at position {} is outside the vocabulary [0, {}); the data was tokenized with a larger "
              "vocabulary than --vocab-size / the tokenizer in use",
              id, t, V);
  }
  const size_t row_bytes = static_cast<size_t>(H) * dtype_size(w_VH.dtype());
  const char* w = static_cast<const char*>(w_VH.raw());
  char* y = static_cast<char*>(y_TH.raw());
  _Pragma("omp parallel for schedule(static)") for (int64_t t = 0; t < T_; t++) {
    const int64_t r = id_at(ids_T, t) - vocab_start;
    if (r >= 0 && r < VL)
      std::memcpy(y + t * row_bytes, w + r * row_bytes, row_bytes);
    else
      std::memset(y + t * row_bytes, 0, row_bytes);
  }
}

void embedding_backward(const Tensor& dy_TH, const Tensor& ids_T, Tensor& dw_VH, int64_t vocab_start) {
  const int64_t T_ = ids_T.numel(), H = dw_VH.dim(1), VL = dw_VH.dim(0);
  MOE_ASSERT(dy_TH.rows() == T_ && dy_TH.cols() == H && dy_TH.dtype() == dw_VH.dtype());
  constexpr int64_t kCols = 64;
  const int64_t nblk = (H + kCols - 1) / kCols;
  MOE_DISPATCH_FLOAT(dw_VH.dtype(), T, {
    const T* dy = dy_TH.data<T>();
    T* dw = dw_VH.data<T>();
    _Pragma("omp parallel for schedule(static)") for (int64_t b = 0; b < nblk; b++) {
      const int64_t j0 = b * kCols, j1 = std::min(H, j0 + kCols);
      for (int64_t t = 0; t < T_; t++) {
        const int64_t r = id_at(ids_T, t) - vocab_start;
        if (r < 0 || r >= VL) continue;
        T* row = dw + r * H;
        const T* g = dy + t * H;
        for (int64_t j = j0; j < j1; j++) row[j] += g[j];
      }
    }
  });
}

// This backend's table (kernels/backends.h).
const EmbeddingKernels kEmbeddingKernels{embedding_forward, embedding_backward};

}  // namespace moecore::kernels::cpu
