// The learned position embedding's row ops on the GPU (kernels/position_rows.h; declared in kernels.h): f32.
#include "moecore/device/stream.h"
#include "moecore/kernels/backends.h"
#include "moecore/kernels/cuda/kernels.h"
#include "moecore/kernels/cuda/launch_position_rows.h"
#include "moecore/kernels/cuda/tensor_args.h"

namespace moecore::kernels::cuda {

using detail::check_launch;
using detail::f32;

void position_add_rows(Tensor& h_nBH, const Tensor& table_nH) {
  const int64_t n = h_nBH.dim(0), B = h_nBH.dim(1), H = h_nBH.dim(2);
  MOE_ASSERT(table_nH.numel() == n * H);
  launch::position_add_rows(f32(h_nBH, "h"), f32(table_nH, "table"), n, B, H, moecore::device::current_stream());
  check_launch("position_add_rows");
}

void position_sum_rows(const Tensor& dh_nBH, Tensor& grad_nH) {
  const int64_t n = dh_nBH.dim(0), B = dh_nBH.dim(1), H = dh_nBH.dim(2);
  MOE_ASSERT(grad_nH.numel() == n * H);
  launch::position_sum_rows(f32(dh_nBH, "dh"), f32(grad_nH, "grad"), n, B, H, moecore::device::current_stream());
  check_launch("position_sum_rows");
}

// This backend's table (kernels/backends.h).
const PositionRowsKernels kPositionRowsKernels{position_add_rows, position_sum_rows};

}  // namespace moecore::kernels::cuda
