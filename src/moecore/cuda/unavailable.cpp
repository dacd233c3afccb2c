// The CUDA runtime interface (runtime.h) in a CPU-only build: no GPU is ever visible, and any call that would touch
// one throws. Tensors on `cuda` cannot be created here, so the kernel stubs below are never reached by a correct
// caller; they throw the same message if one does.
#include <string>

#include "moecore/core/error.h"
#include "moecore/cuda/runtime.h"
#include "moecore/kernels/cuda/kernels.h"

namespace moecore::cuda {

namespace {
[[noreturn]] void no_cuda(const char* what) {
  throw Error(
      fmt::format("{}: this moecore was built without CUDA (rebuild with -DMOECORE_CUDA=ON where the CUDA "
                  "toolkit is installed, or use --device cpu)",
                  what));
}
}  // namespace

[[noreturn]] void no_cuda_kernel(const char* name) {
  no_cuda(fmt::format("the CUDA kernel {}", name).c_str());
}

bool built_with_cuda() {
  return false;
}
int visible_devices(std::string* why) {
  if (why) *why = "this moecore was built without CUDA";
  return 0;
}
void* device_allocate(size_t, Device) {
  no_cuda("allocating GPU memory");
}
void device_deallocate(void*, Device) {
  no_cuda("freeing GPU memory");
}
AllocatorStats device_allocator_stats(Device) {
  no_cuda("GPU allocator statistics");
}
AllocatorMark device_allocator_mark(Device) {
  no_cuda("GPU allocator statistics");
}
int64_t device_system_allocs_since(Device, const AllocatorMark&) {
  no_cuda("GPU allocator statistics");
}
void device_reset_peak(Device) {
  no_cuda("GPU allocator statistics");
}
void device_empty_cache(Device) {
  no_cuda("GPU allocator");
}
void copy_bytes(void*, Device, const void*, Device, size_t) {
  no_cuda("copying to or from a GPU");
}
void zero_bytes(void*, size_t, Device) {
  no_cuda("zeroing GPU memory");
}
void convert_on_device(void*, DType, const void*, DType, int64_t) {
  no_cuda("converting on a GPU");
}
void synchronize() {}
std::string describe_device(Device) {
  no_cuda("describing a GPU");
}

}  // namespace moecore::cuda

namespace moecore::kernels::cuda {

#define MOE_NO_CUDA_KERNEL(name) ::moecore::cuda::no_cuda_kernel(name)

void gemm(const Tensor&, bool, const Tensor&, bool, Tensor&, float, float, int64_t) {
  MOE_NO_CUDA_KERNEL("gemm");
}
void set_allow_tf32(bool) {}
bool allow_tf32() {
  return false;
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
void rmsnorm_forward(const Tensor&, const Tensor&, double, Tensor&, Tensor&) {
  MOE_NO_CUDA_KERNEL("rmsnorm_forward");
}
void rmsnorm_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, Tensor&, Tensor&) {
  MOE_NO_CUDA_KERNEL("rmsnorm_backward");
}
void layernorm_forward(const Tensor&, const Tensor&, const Tensor&, double, Tensor&, Tensor&, Tensor&) {
  MOE_NO_CUDA_KERNEL("layernorm_forward");
}
void layernorm_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, Tensor&, Tensor&,
                        Tensor&) {
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
void adamw_step(Tensor&, const Tensor&, Tensor&, Tensor&, const AdamWParams&, int64_t) {
  MOE_NO_CUDA_KERNEL("adamw_step");
}
void adamw_multi_step(const std::vector<AdamWTensors>&, const AdamWParams&, int64_t) {
  MOE_NO_CUDA_KERNEL("adamw_step");
}
void attention_forward(const Tensor&, const Tensor&, const Tensor&, double, Tensor&, Tensor&, bool, bool) {
  MOE_NO_CUDA_KERNEL("attention_forward");
}
void attention_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                        double, Tensor&, Tensor&, Tensor&, bool, bool) {
  MOE_NO_CUDA_KERNEL("attention_backward");
}

}  // namespace moecore::kernels::cuda
