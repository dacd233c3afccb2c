// cuDNN's backend (graph) API, loaded at run time with dlopen: the dozen entry points the fused-attention path calls
// (attention_cudnn_graph.cpp, attention_cudnn.cpp). Loading rather than linking keeps every moecore binary starting
// where libcudnn is absent (the packed GPU binaries, CPU machines): the attention then runs the native kernels and
// says why once. Only cuDNN's headers are needed at build time (cudnn_graph.h, from the CUDA toolkit folder).
#pragma once

// The CUDA build with cuDNN's headers on its include path (cmake/cuda.cmake); a CPU-only build never has them.
#if defined(MOECORE_HAVE_CUDA) && __has_include(<cudnn_graph.h>)
#include <cudnn_graph.h>
#define MOECORE_HAVE_CUDNN_HEADERS 1
#endif

#include <cstdint>
#include <string>

namespace moecore::kernels::cuda {

#ifdef MOECORE_HAVE_CUDNN_HEADERS
struct CudnnApi {
  size_t (*GetVersion)(void) = nullptr;
  const char* (*GetErrorString)(cudnnStatus_t) = nullptr;
  void (*GetLastErrorString)(char*, size_t) = nullptr;  // cuDNN ≥ 9.0
  cudnnStatus_t (*Create)(cudnnHandle_t*) = nullptr;
  cudnnStatus_t (*Destroy)(cudnnHandle_t) = nullptr;
  cudnnStatus_t (*SetStream)(cudnnHandle_t, cudaStream_t) = nullptr;
  cudnnStatus_t (*CreateDescriptor)(cudnnBackendDescriptorType_t, cudnnBackendDescriptor_t*) = nullptr;
  cudnnStatus_t (*DestroyDescriptor)(cudnnBackendDescriptor_t) = nullptr;
  cudnnStatus_t (*Finalize)(cudnnBackendDescriptor_t) = nullptr;
  cudnnStatus_t (*SetAttribute)(cudnnBackendDescriptor_t, cudnnBackendAttributeName_t, cudnnBackendAttributeType_t,
                                int64_t, const void*) = nullptr;
  cudnnStatus_t (*GetAttribute)(cudnnBackendDescriptor_t, cudnnBackendAttributeName_t, cudnnBackendAttributeType_t,
                                int64_t, int64_t*, void*) = nullptr;
  cudnnStatus_t (*Execute)(cudnnHandle_t, cudnnBackendDescriptor_t, cudnnBackendDescriptor_t) = nullptr;
  int64_t version = 0;  // GetVersion() of the loaded library
  std::string path;     // which library dlopen found
};

// The loaded API, or null with `why` set (the library is missing, lacks an entry point, or is older than
// kMinCudnnVersion). Loaded once per process; later calls return the same answer.
const CudnnApi* cudnn_api(std::string* why);

// A failed cuDNN call: its name, the status and cuDNN's last error message.
std::string cudnn_error_text(const CudnnApi& api, const char* call, cudnnStatus_t st);
#endif

// Whether cuDNN's fused attention can run in this process (the library loads, is new enough and creates a handle on
// the current GPU), and if not why. Answers "this build has no cuDNN headers" where the toolkit had none.
bool cudnn_attention_available(std::string* why);
// The loaded cuDNN's version (major·10000 + minor·100 + patch), 0 when it is not loaded.
int64_t cudnn_loaded_version();

}  // namespace moecore::kernels::cuda
