// The GPU router (moe/router_cuda.cpp) in a CPU-only build: Router::forward / backward take this path only for a
// CUDA tensor, which cannot exist here; a caller that reaches it anyway gets the build's "without CUDA" message.
#include "moecore/device/runtime.h"
#include "moecore/moe/aux_losses.h"
#include "moecore/moe/router.h"

namespace moecore::moe {

Router::Output Router::forward_cuda(const Tensor&, int64_t, int64_t, bool, Stash&) {
  ::moecore::cuda::no_cuda_kernel("router forward");
}

Tensor Router::backward_cuda(const Tensor&, DType, double, Stash&) {
  ::moecore::cuda::no_cuda_kernel("router backward");
}

double aux_loss_gpu(const Tensor&, const Tensor&, double, const comm::ProcessGroup*, Tensor&) {
  ::moecore::cuda::no_cuda_kernel("aux_loss");
}
double seq_aux_loss_gpu(const Tensor&, const Tensor&, int64_t, int64_t, double, const comm::ProcessGroup*, Tensor&) {
  ::moecore::cuda::no_cuda_kernel("seq_aux_loss");
}
double global_aux_loss_gpu(const Tensor&, const Tensor&, double, const comm::ProcessGroup*, double, GlobalAuxCounts&,
                           Tensor&) {
  ::moecore::cuda::no_cuda_kernel("global_aux_loss");
}

}  // namespace moecore::moe
