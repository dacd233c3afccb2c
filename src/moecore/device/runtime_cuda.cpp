// The CUDA runtime interface (runtime.h) of a CUDA build: device count, per-GPU caching allocators on cudaMalloc,
// copies and conversions ordered on the current stream.
#include <array>
#include <memory>
#include <mutex>

#include "moecore/core/allocator.h"
#include "moecore/core/cpu.h"
#include "moecore/core/error.h"
#include "moecore/device/caching_allocator.h"
#include "moecore/device/check.h"
#include "moecore/device/gpu_profile.h"
#include "moecore/device/launch_convert.h"
#include "moecore/device/runtime.h"
#include "moecore/device/stream.h"

namespace moecore::device {

bool built_with_cuda() {
  return true;
}

int visible_devices(std::string* why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" state
    if (why) *why = fmt::format("cudaGetDeviceCount: {}", cudaGetErrorString(e));
    return 0;
  }
  if (n == 0 && why) *why = "cudaGetDeviceCount reports 0 devices";
  return n;
}

namespace {
constexpr int kMaxDevices = 16;

class DeviceScope {  // makes GPU d current for a call, and restores the previous one
 public:
  explicit DeviceScope(int d) {
    MOE_CUDA_CHECK(cudaGetDevice(&prev_));
    if (prev_ != d) MOE_CUDA_CHECK(cudaSetDevice(d));
    d_ = d;
  }
  ~DeviceScope() {
    if (prev_ != d_) cudaSetDevice(prev_);
  }

 private:
  int prev_ = 0, d_ = 0;
};

CachingAllocator& allocator_of(Device d) {
  MOE_ASSERT_MSG(d.is_cuda() && d.index >= 0 && d.index < kMaxDevices, "no allocator for device {}", d.str());
  static std::array<std::unique_ptr<CachingAllocator>, kMaxDevices>* all =
      new std::array<std::unique_ptr<CachingAllocator>, kMaxDevices>();  // never destroyed (static order)
  static std::mutex* mu = new std::mutex();  // tensors may be freed during static destruction
  std::lock_guard<std::mutex> lock(*mu);
  auto& a = (*all)[d.index];
  if (!a) {
    const int index = d.index;
    RawBackend b;
    b.name = fmt::format("GPU {}", index);
    b.allocate = [index](size_t n) -> void* {
      DeviceScope scope(index);
      void* p = nullptr;
      const cudaError_t e = cudaMalloc(&p, n);
      if (e == cudaErrorMemoryAllocation) {
        cudaGetLastError();
        return nullptr;
      }
      MOE_CUDA_CHECK(e);
      return p;
    };
    b.release = [index](void* p) {
      DeviceScope scope(index);
      cudaFree(p);
    };
    b.synchronize = [index] {
      const SyncProbe probe("device synchronize (allocator out of memory)", 0);
      DeviceScope scope(index);
      MOE_CUDA_CHECK(cudaDeviceSynchronize());
    };
    a = std::make_unique<CachingAllocator>(std::move(b));
  }
  return *a;
}
}  // namespace

void* device_allocate(size_t bytes, Device d) {
  return allocator_of(d).allocate(bytes, reinterpret_cast<uintptr_t>(current_stream()));
}
void device_deallocate(void* ptr, Device d) {
  allocator_of(d).deallocate(ptr);
}
AllocatorStats device_allocator_stats(Device d) {
  if (d.is_cpu()) return Allocator::instance().stats();
  return allocator_of(d).stats();
}
AllocatorMark device_allocator_mark(Device d) {
  return allocator_of(d).mark();
}
int64_t device_system_allocs_since(Device d, const AllocatorMark& m) {
  return allocator_of(d).system_allocs_since(m);
}
void device_reset_peak(Device d) {
  if (d.is_cpu()) return;
  allocator_of(d).reset_peak();
}
void device_empty_cache(Device d) {
  allocator_of(d).empty_cache();
}

void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) {
  if (bytes == 0) return;
  const cudaMemcpyKind kind = dst_device.is_cuda()
                                  ? (src_device.is_cuda() ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice)
                                  : (src_device.is_cuda() ? cudaMemcpyDeviceToHost : cudaMemcpyHostToHost);
  const char* what = kind == cudaMemcpyDeviceToHost   ? "copy device->host"
                     : kind == cudaMemcpyHostToDevice ? "copy host->device"
                     : kind == cudaMemcpyHostToHost   ? "copy host->host (stream synchronize)"
                                                      : nullptr;
  const SyncProbe probe(what, bytes);  // a host synchronisation (the GPU profile counts it)
  MOE_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, current_stream()));
  // Host memory may be pageable and reused as soon as we return: wait when the host is involved.
  if (kind != cudaMemcpyDeviceToDevice) MOE_CUDA_CHECK(cudaStreamSynchronize(current_stream()));
}

void copy_2d(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width_bytes, size_t rows,
             Device d) {
  MOE_ASSERT_MSG(d.is_cuda(), "copy_2d runs on a GPU, not on {}", d.str());
  MOE_ASSERT(width_bytes <= dst_pitch && width_bytes <= src_pitch);
  if (width_bytes == 0 || rows == 0) return;
  MOE_CUDA_CHECK(
      cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, width_bytes, rows, cudaMemcpyDeviceToDevice, current_stream()));
}

void zero_bytes(void* ptr, size_t bytes, Device d) {
  if (bytes) MOE_CUDA_CHECK(cudaMemsetAsync(ptr, 0, bytes, current_stream()));
}

void convert_on_device(void* dst, DType dst_dtype, const void* src, DType src_dtype, int64_t n) {
  const PhaseScope phase(Phase::kCast);
  launch::convert(dst, static_cast<int>(dst_dtype), src, static_cast<int>(src_dtype), n, current_stream());
  MOE_CUDA_CHECK(cudaGetLastError());
}

void synchronize() {
  const SyncProbe probe("stream synchronize", 0);
  MOE_CUDA_CHECK(cudaStreamSynchronize(current_stream()));
}

void synchronize(Device d) {
  if (!d.is_cpu()) synchronize();
}

std::string describe_device(Device d) {
  if (d.is_cpu()) return fmt::format("the CPU, {} threads", num_threads());
  cudaDeviceProp p{};
  MOE_CUDA_CHECK(cudaGetDeviceProperties(&p, d.index));
  return fmt::format("{}, {} SMs, {:.1f} GiB, compute {}.{}", p.name, p.multiProcessorCount,
                     static_cast<double>(p.totalGlobalMem) / 0x1p30, p.major, p.minor);
}

void set_current_device(Device d) {
  if (d.is_cpu()) return;
  MOE_CUDA_CHECK(cudaSetDevice(d.index));
}

}  // namespace moecore::device
