// Multi-latent attention's GPU block moves in a CPU-only build (see device/runtime_unavailable.cpp): never reached,
// since no GPU tensor can exist there.
#include "moecore/device/runtime.h"
#include "moecore/kernels/cuda/kernels.h"

namespace moecore::kernels::cuda {

void mla_move_block(const Tensor&, int64_t, int64_t, int64_t, Tensor&, int64_t, int64_t, int64_t, int64_t, int64_t) {
  moecore::device::no_cuda_kernel("mla_move_block");
}

}  // namespace moecore::kernels::cuda
