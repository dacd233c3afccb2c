// The shared-expert gate's GPU entry points in a CPU-only build (see device/runtime_unavailable.cpp): never reached,
// since no GPU tensor can exist there.
#include "moecore/device/runtime.h"
#include "moecore/kernels/cuda/kernels.h"

namespace moecore::kernels::cuda {

void shared_gate_forward(Tensor&, const Tensor&, Tensor&) {
  moecore::device::no_cuda_kernel("shared_gate_forward");
}
void shared_gate_backward(const Tensor&, const Tensor&, const Tensor&, Tensor&, Tensor&) {
  moecore::device::no_cuda_kernel("shared_gate_backward");
}

}  // namespace moecore::kernels::cuda
