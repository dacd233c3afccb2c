// The Tensor-level CUDA kernels (kernels.h) in a CPU-only build: no CUDA tensor can exist there, so a correct caller
// never reaches these; one that does gets the build's "without CUDA" message.
#include "moecore/device/runtime.h"
#include "moecore/kernels/cuda/kernels.h"

namespace moecore::kernels::cuda {

#define MOE_NO_CUDA_KERNEL(name) ::moecore::device::no_cuda_kernel(name)

void gemm(const Tensor&, bool, const Tensor&, bool, Tensor&, float, float) {
  MOE_NO_CUDA_KERNEL("gemm");
}
void gemm_batched(const Tensor&, bool, const Tensor&, bool, Tensor&, float, float) {
  MOE_NO_CUDA_KERNEL("gemm_batched");
}
void set_allow_tf32(bool) {}
bool allow_tf32() {
  return false;
}
void copy_cols(const Tensor&, int64_t, int64_t, Tensor&, int64_t, int64_t, int64_t, int64_t) {
  MOE_NO_CUDA_KERNEL("copy_cols");
}
void add_(Tensor&, const Tensor&) {
  MOE_NO_CUDA_KERNEL("add_");
}
void add(const Tensor&, const Tensor&, Tensor&) {
  MOE_NO_CUDA_KERNEL("add");
}
void scale_(Tensor&, double) {
  MOE_NO_CUDA_KERNEL("scale_");
}
void fill_(Tensor&, double) {
  MOE_NO_CUDA_KERNEL("fill_");
}
double sum(const Tensor&) {
  MOE_NO_CUDA_KERNEL("sum");
}
double dot(const Tensor&, const Tensor&) {
  MOE_NO_CUDA_KERNEL("dot");
}
double sum_squares(const Tensor&) {
  MOE_NO_CUDA_KERNEL("sum_squares");
}
int64_t count_zeros(const Tensor&) {
  MOE_NO_CUDA_KERNEL("count_zeros");
}
void rmsnorm_forward(const Tensor&, const Tensor&, double, Tensor&, Tensor&) {
  MOE_NO_CUDA_KERNEL("rmsnorm_forward");
}
void rmsnorm_forward_add(Tensor&, const Tensor&, const Tensor&, double, Tensor&, Tensor&) {
  MOE_NO_CUDA_KERNEL("rmsnorm_forward_add");
}
void rmsnorm_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, Tensor&, Tensor&, const Tensor*) {
  MOE_NO_CUDA_KERNEL("rmsnorm_backward");
}
void layernorm_forward(const Tensor&, const Tensor&, const Tensor&, double, Tensor&, Tensor&, Tensor&) {
  MOE_NO_CUDA_KERNEL("layernorm_forward");
}
void layernorm_forward_add(Tensor&, const Tensor&, const Tensor&, const Tensor&, double, Tensor&, Tensor&, Tensor&) {
  MOE_NO_CUDA_KERNEL("layernorm_forward_add");
}
void layernorm_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, Tensor&, Tensor&,
                        Tensor&, const Tensor*) {
  MOE_NO_CUDA_KERNEL("layernorm_backward");
}
void segment_bias_forward(const Tensor&, const Tensor*, const RowSegments&, Tensor&) {
  MOE_NO_CUDA_KERNEL("segment_bias_forward");
}
void segment_bias_backward(const Tensor&, const Tensor*, const RowSegments&, Tensor&, const Tensor*, Tensor*) {
  MOE_NO_CUDA_KERNEL("segment_bias_backward");
}
void rope_forward_at(const Tensor&, const Tensor&, const Tensor&, int64_t, int64_t, RopePairs, Tensor&) {
  MOE_NO_CUDA_KERNEL("rope_forward");
}
void rope_backward_at(const Tensor&, const Tensor&, const Tensor&, int64_t, int64_t, RopePairs, Tensor&) {
  MOE_NO_CUDA_KERNEL("rope_backward");
}
void activation_forward(Activation, const Tensor&, const Tensor*, Tensor&) {
  MOE_NO_CUDA_KERNEL("activation_forward");
}
void activation_backward(Activation, const Tensor&, const Tensor&, const Tensor*, Tensor&, Tensor*) {
  MOE_NO_CUDA_KERNEL("activation_backward");
}
void embedding_forward(const Tensor&, const Tensor&, Tensor&, int64_t, int64_t) {
  MOE_NO_CUDA_KERNEL("embedding_forward");
}
void embedding_backward(const Tensor&, const Tensor&, Tensor&, int64_t) {
  MOE_NO_CUDA_KERNEL("embedding_backward");
}
void cross_entropy_forward(const Tensor&, const Tensor&, Tensor&, Tensor&) {
  MOE_NO_CUDA_KERNEL("cross_entropy_forward");
}
void cross_entropy_forward_vocab_parallel(const Tensor&, const Tensor&, int64_t, int64_t, const ReduceFn&, Tensor&,
                                          Tensor&) {
  MOE_NO_CUDA_KERNEL("cross_entropy_forward");
}
void cross_entropy_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, Tensor&, int64_t) {
  MOE_NO_CUDA_KERNEL("cross_entropy_backward");
}
void cross_entropy_forward_backward(Tensor&, const Tensor&, const Tensor&, Tensor&, Tensor&) {
  MOE_NO_CUDA_KERNEL("cross_entropy_forward_backward");
}
void adamw_step(Tensor&, const Tensor&, Tensor&, Tensor&, const AdamWParams&, int64_t) {
  MOE_NO_CUDA_KERNEL("adamw_step");
}
void adamw_multi_step(const std::vector<AdamWTensors>&, const AdamWParams&, int64_t) {
  MOE_NO_CUDA_KERNEL("adamw_step");
}
void adamw_step_multi(std::vector<AdamWTensor>&, const AdamWParams&, int64_t) {
  MOE_NO_CUDA_KERNEL("adamw_step_multi");
}
void sgd_step(Tensor&, const Tensor&, Tensor&, const SgdParams&) {
  MOE_NO_CUDA_KERNEL("sgd_step");
}
void dropout_forward(const Tensor&, const DropoutMask&, const std::vector<int64_t>&, int64_t, Tensor&) {
  MOE_NO_CUDA_KERNEL("dropout_forward");
}

}  // namespace moecore::kernels::cuda
