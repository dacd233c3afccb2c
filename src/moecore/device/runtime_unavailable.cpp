// The CUDA runtime interface (runtime.h) in a CPU-only build: no GPU is ever visible, and any call that would touch
// one throws. Tensors on `cuda` cannot be created here; the CPU-only build's kernel stand-ins
// (kernels/cuda/*_unavailable.cpp) throw through no_cuda_kernel if a caller reaches one anyway.
#include <fmt/format.h>

#include <string>

#include "moecore/core/allocator.h"
#include "moecore/core/cpu.h"
#include "moecore/core/error.h"
#include "moecore/device/runtime.h"

namespace moecore::device {

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
AllocatorStats device_allocator_stats(Device d) {
  if (d.is_cpu()) return Allocator::instance().stats();
  no_cuda("GPU allocator statistics");
}
AllocatorMark device_allocator_mark(Device) {
  no_cuda("GPU allocator statistics");
}
int64_t device_system_allocs_since(Device, const AllocatorMark&) {
  no_cuda("GPU allocator statistics");
}
void device_reset_peak(Device d) {
  if (!d.is_cpu()) no_cuda("GPU allocator statistics");
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
void synchronize(Device) {}
std::string describe_device(Device d) {
  if (d.is_cpu()) return fmt::format("the CPU, {} threads", num_threads());
  no_cuda("describing a GPU");
}
void copy_2d(void*, size_t, const void*, size_t, size_t, size_t, Device) {
  no_cuda("copying on a GPU (cudaMemcpy2DAsync)");
}

void set_current_device(Device d) {
  if (!d.is_cpu()) no_cuda("set_current_device");
}

}  // namespace moecore::device
