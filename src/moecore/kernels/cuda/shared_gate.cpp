// The shared-expert gate on the GPU (kernels/shared_gate.h; declared in kernels.h): f32, the backward's row sums in
// a fixed tree.
#include "moecore/device/stream.h"
#include "moecore/kernels/backends.h"
#include "moecore/kernels/cuda/kernels.h"
#include "moecore/kernels/cuda/launch_shared_gate.h"
#include "moecore/kernels/cuda/tensor_args.h"

namespace moecore::kernels::cuda {

using detail::check_launch;
using detail::f32;

void shared_gate_forward(Tensor& gate_T, const Tensor& m_TH, Tensor& y_TH) {
  const int64_t T = m_TH.rows(), H = m_TH.cols();
  MOE_ASSERT(gate_T.numel() == T && y_TH.numel() == T * H);
  launch::shared_gate_forward(f32(gate_T, "gate_T"), f32(m_TH, "m_TH"), f32(y_TH, "y_TH"), T, H,
                              moecore::device::current_stream());
  check_launch("shared_gate_forward");
}

void shared_gate_backward(const Tensor& dy_TH, const Tensor& gate_T, const Tensor& m_TH, Tensor& dm_TH, Tensor& dz_T) {
  const int64_t T = m_TH.rows(), H = m_TH.cols();
  MOE_ASSERT(gate_T.numel() == T && dy_TH.numel() == T * H && dm_TH.numel() == T * H && dz_T.numel() == T);
  launch::shared_gate_backward(f32(dy_TH, "dy_TH"), f32(gate_T, "gate_T"), f32(m_TH, "m_TH"), f32(dm_TH, "dm_TH"),
                               f32(dz_T, "dz_T"), T, H, moecore::device::current_stream());
  check_launch("shared_gate_backward");
}

// This backend's table (kernels/backends.h).
const SharedGateKernels kSharedGateKernels{shared_gate_forward, shared_gate_backward};

}  // namespace moecore::kernels::cuda
