// Column-block copies on the GPU (see elementwise.h copy_cols): one pitched copy (cudaMemcpy2DAsync on the current
// stream) of `rows` rows. Operands checked by the caller (kernels/dispatch.cpp).
#include "moecore/device/runtime.h"
#include "moecore/kernels/cuda/kernels.h"

namespace moecore::kernels::cuda {

void copy_cols(const Tensor& src, int64_t src_cols, int64_t src_col, Tensor& dst, int64_t dst_cols, int64_t dst_col,
               int64_t rows, int64_t cols) {
  if (rows == 0 || cols == 0) return;
  const auto es = static_cast<size_t>(dtype_size(src.dtype()));
  moecore::device::copy_2d(
      static_cast<char*>(dst.raw()) + static_cast<size_t>(dst_col) * es, static_cast<size_t>(dst_cols) * es,
      static_cast<const char*>(src.raw()) + static_cast<size_t>(src_col) * es, static_cast<size_t>(src_cols) * es,
      static_cast<size_t>(cols) * es, static_cast<size_t>(rows), dst.device());
}

}  // namespace moecore::kernels::cuda
