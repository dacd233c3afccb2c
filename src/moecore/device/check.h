// Error checks for CUDA runtime and cuBLAS(Lt) calls, in core/error.h's style: the message names the call, the
// library's error name and string, and file:line. A GPU error is not the user's input, but it is usually the
// machine's (driver, memory, another process), so it is an Error (clean message, non-zero exit), not a crash.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

namespace moecore::device {
[[noreturn]] void throw_cuda_error(const char* call, cudaError_t e, const char* file, int line);
[[noreturn]] void throw_cublas_error(const char* call, cublasStatus_t s, const char* file, int line);
}  // namespace moecore::device

#define MOE_CUDA_CHECK(call)                                                                                         \
  do {                                                                                                               \
    const cudaError_t moe_cuda_err_ = (call);                                                                        \
    if (moe_cuda_err_ != cudaSuccess) ::moecore::device::throw_cuda_error(#call, moe_cuda_err_, __FILE__, __LINE__); \
  } while (0)

// After a kernel launch: launch-configuration errors surface here, not at the next unrelated call.
#define MOE_CUDA_CHECK_LAUNCH(name) MOE_CUDA_CHECK(((void)(name), cudaGetLastError()))

#define MOE_CUBLAS_CHECK(call)                                                          \
  do {                                                                                  \
    const cublasStatus_t moe_cublas_st_ = (call);                                       \
    if (moe_cublas_st_ != CUBLAS_STATUS_SUCCESS)                                        \
      ::moecore::device::throw_cublas_error(#call, moe_cublas_st_, __FILE__, __LINE__); \
  } while (0)
