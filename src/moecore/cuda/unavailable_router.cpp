// The GPU router (moe/router_cuda.cpp) in a CPU-only build: Router::forward / backward take this path only for a
// CUDA tensor, which cannot exist here; a caller that reaches it anyway gets the build's "without CUDA" message.
#include "moecore/moe/router.h"

namespace moecore::cuda {
[[noreturn]] void no_cuda_kernel(const char* name);  // cuda/unavailable.cpp
}  // namespace moecore::cuda

namespace moecore::moe {

Router::Output Router::forward_cuda(const Tensor&, int64_t, int64_t, bool, Stash&) {
  ::moecore::cuda::no_cuda_kernel("router forward");
}

Tensor Router::backward_cuda(const Tensor&, DType, double, Stash&) {
  ::moecore::cuda::no_cuda_kernel("router backward");
}

}  // namespace moecore::moe
