// Tensor-level hidden dropout on the GPU (kernels.h): operand checks, then dropout.cu's kernel on the current stream.
#include <vector>

#include "moecore/device/stream.h"
#include "moecore/kernels/backends.h"
#include "moecore/kernels/cuda/dropout_params.h"
#include "moecore/kernels/cuda/kernels.h"
#include "moecore/kernels/cuda/tensor_args.h"

namespace moecore::kernels::cuda {

void dropout_forward(const Tensor& x_SBC, const DropoutMask& m, const std::vector<int64_t>& sample_B,
                     int64_t seq_offset, Tensor& y_SBC) {
  const int64_t B = static_cast<int64_t>(sample_B.size());
  const int64_t C = x_SBC.dim(x_SBC.ndim() - 1), rows = x_SBC.numel() / C;
  const launch::DropoutParams p = detail::dropout_params(m, sample_B.data(), B, seq_offset);
  launch::dropout_apply(detail::f32(x_SBC, "dropout input"), detail::f32(y_SBC, "dropout output"), rows, C, p,
                        moecore::device::current_stream());
  detail::check_launch("dropout");
}

// This backend's table (kernels/backends.h).
const DropoutKernels kDropoutKernels{dropout_forward};

}  // namespace moecore::kernels::cuda
