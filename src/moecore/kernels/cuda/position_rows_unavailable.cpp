// The learned position embedding's GPU entry points in a CPU-only build (see device/runtime_unavailable.cpp): never
// reached.
#include "moecore/device/runtime.h"
#include "moecore/kernels/cuda/kernels.h"

namespace moecore::kernels::cuda {

void position_add_rows(Tensor&, const Tensor&) {
  moecore::device::no_cuda_kernel("position_add_rows");
}
void position_sum_rows(const Tensor&, Tensor&) {
  moecore::device::no_cuda_kernel("position_sum_rows");
}

}  // namespace moecore::kernels::cuda
