// What a Tensor needs from the GPU runtime to hold memory on a GPU: allocation, byte copies, zeroing and dtype
// conversion. Declared here so that core/ stays below the device layer; defined by device/ (runtime_cuda.cpp, or
// runtime_unavailable.cpp in a CPU-only build, where they throw). The rest of the runtime is device/runtime.h.
#pragma once

#include <cstddef>
#include <cstdint>

#include "moecore/core/device.h"
#include "moecore/core/dtype.h"

namespace moecore::device {

// Device memory from the stream-ordered caching allocator of GPU d, on the calling thread's current stream.
void* device_allocate(size_t bytes, Device d);
void device_deallocate(void* ptr, Device d);
// Byte copy between any two devices, ordered on the current stream; returns when the copy is complete.
void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes);
// Zero bytes on the GPU (stream-ordered).
void zero_bytes(void* ptr, size_t bytes, Device d);
// Element conversion between floating dtypes (f32, f64, bf16) of n elements, both on the GPU.
void convert_on_device(void* dst, DType dst_dtype, const void* src, DType src_dtype, int64_t n);

}  // namespace moecore::device
