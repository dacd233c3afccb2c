// The CUDA runtime as the rest of moecore sees it: plain host declarations, no CUDA headers, so the kernels and
// everything above them include it in every build (core/ sees only core/device_memory.h). A CUDA build implements
// it in runtime_cuda.cpp; a CPU-only build in runtime_unavailable.cpp, where every call that would touch a GPU throws
// "this moecore was built without CUDA".
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "moecore/core/allocator.h"
#include "moecore/core/device.h"
#include "moecore/core/device_memory.h"
#include "moecore/core/dtype.h"

namespace moecore::device {

// True when this binary was compiled with the CUDA backend (MOECORE_HAVE_CUDA).
bool built_with_cuda();
// GPUs visible to this process; 0 when none, with the one-line reason in *why (CPU-only build, no driver, the
// runtime's error string, or "0 devices").
int visible_devices(std::string* why = nullptr);

// Device memory (allocation, copies, conversion): core/device_memory.h.
AllocatorStats device_allocator_stats(Device d);  // the CPU: the host allocator's
// The statistics of the memory training uses on `d`: the GPU's caching allocator, or the host allocator's.
inline AllocatorStats memory_stats(Device d) {
  return d.is_cuda() ? device_allocator_stats(d) : Allocator::instance().stats();
}
AllocatorMark device_allocator_mark(Device d);
int64_t device_system_allocs_since(Device d, const AllocatorMark& m);
void device_reset_peak(Device d);  // nothing for the CPU
void device_empty_cache(Device d);

// Strided copy of `rows` rows of width_bytes each, on GPU d (both pointers there), ordered on the current stream:
// row r goes from src + r·src_pitch to dst + r·dst_pitch (cudaMemcpy2DAsync; pitches in bytes, >= width_bytes).
void copy_2d(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width_bytes, size_t rows, Device d);
// Waits for all work on the current stream.
void synchronize();
// The same where `d` is a GPU; nothing for the CPU (its work is done when a call returns).
void synchronize(Device d);
// Makes GPU d this thread's current device (cudaSetDevice): kernels, streams and NCCL communicators go there. A
// rank that owns GPU N (one GPU per rank) calls it once at start. Nothing for the CPU.
void set_current_device(Device d);
// "NVIDIA H100 80GB HBM3, 132 SMs, 79.1 GiB, compute 9.0" (for benchmark headers).
std::string describe_device(Device d);  // the CPU: "the CPU, N threads"

// A CPU-only build's answer to a CUDA kernel that a caller reached anyway (no CUDA tensor can exist there): throws
// "the CUDA kernel <name>: this moecore was built without CUDA ...". Defined only in that build
// (runtime_unavailable.cpp), for the kernels' stand-ins (kernels/cuda/*_unavailable.cpp).
[[noreturn]] void no_cuda_kernel(const char* name);

}  // namespace moecore::device
