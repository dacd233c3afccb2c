// Column-block copies on the CPU (see elementwise.h copy_cols): one memcpy per row. Operands checked by the caller
// (kernels/dispatch.cpp).
#include <cstring>

#include "moecore/kernels/cpu/kernels.h"

namespace moecore::kernels::cpu {

void copy_cols(const Tensor& src, int64_t src_cols, int64_t src_col, Tensor& dst, int64_t dst_cols, int64_t dst_col,
               int64_t rows, int64_t cols) {
  const auto es = static_cast<int64_t>(dtype_size(src.dtype()));
  const auto* in = static_cast<const char*>(src.raw());
  auto* out = static_cast<char*>(dst.raw());
  const auto n = static_cast<size_t>(cols * es);
  for (int64_t r = 0; r < rows; r++)
    std::memcpy(out + (r * dst_cols + dst_col) * es, in + (r * src_cols + src_col) * es, n);
}

}  // namespace moecore::kernels::cpu
