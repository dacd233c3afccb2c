// The router's CUDA backend (kernels/cuda/router_ops.h) in a CPU-only build: kernels/router.cpp calls it only for a
// GPU tensor, which cannot exist here; a caller that reaches it anyway gets the build's "without CUDA" message.
#include "moecore/device/runtime.h"
#include "moecore/kernels/cuda/router_ops.h"

namespace moecore::kernels::cuda {

using moecore::cuda::no_cuda_kernel;

void router_check_backend(DType) {
  no_cuda_kernel("router");
}
void router_rows(const RouterRule&, RouterRows&) {
  no_cuda_kernel("router_rows");
}
void router_capacity(const Tensor&, Tensor&, Tensor&, int64_t, int64_t, bool, bool) {
  no_cuda_kernel("router_capacity");
}
void router_mask_ids(const Tensor&, const Tensor&, Tensor&) {
  no_cuda_kernel("router_mask_ids");
}
void router_expert_counts(const Tensor&, Tensor&) {
  no_cuda_kernel("router_expert_counts");
}
void router_aux_counts(const Tensor&, const Tensor&, int64_t, Tensor&, Tensor&) {
  no_cuda_kernel("router_aux_counts");
}
void router_add_class_coef(Tensor&, const Tensor&) {
  no_cuda_kernel("router_add_class_coef");
}
void router_mul_(Tensor&, const Tensor&) {
  no_cuda_kernel("router_mul_");
}
void router_score_backward(const RouterRule&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                           Tensor&) {
  no_cuda_kernel("router_score_backward");
}
void router_aux_score_backward(bool, const Tensor&, const Tensor&, const Tensor&, double, Tensor&) {
  no_cuda_kernel("router_aux_score_backward");
}
void router_z_loss_backward(const Tensor&, const Tensor&, double, Tensor&) {
  no_cuda_kernel("router_z_loss_backward");
}

}  // namespace moecore::kernels::cuda
