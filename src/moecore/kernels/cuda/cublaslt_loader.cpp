// cuBLASLt loaded at run time with dlopen, as cuDNN is (attention_cudnn_api.cpp): the ten entry points the GEMMs
// call (gemm_cublaslt.cpp, grouped_gemm.cpp) are defined here with cuBLASLt's own C signatures (its header checks
// them), each forwarding to the library, which the first call loads. Linked instead, libcublasLt's static
// initialisers ran at the start of every process of a CUDA build, CPU-only runs and each unit test included: about
// 200 MiB of memory touched and 0.1 s before main. Loading it late also lets a CUDA build run on the CPU where
// libcublasLt is absent; a GEMM on the GPU then names the library and what to do.
#include <cublasLt.h>
#include <dlfcn.h>
#include <fmt/format.h>

#include <string>

#include "moecore/core/error.h"

namespace {

// The library, loaded on the first call (thread-safe); a failure is an Error and the next call tries again.
void* cublaslt_library() {
  static void* const lib = [] {
    std::string tried;
    for (const std::string& name :
         {fmt::format("libcublasLt.so.{}", CUBLAS_VER_MAJOR), std::string("libcublasLt.so")}) {
      if (void* h = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL)) return h;
      const char* e = dlerror();
      tried += fmt::format("{}{}", tried.empty() ? "" : "; ", e ? e : name);
    }
    throw moecore::Error(
        fmt::format("cuBLASLt is not loadable ({}): put the CUDA toolkit's lib folder (or PyTorch's "
                    "nvidia/cublas/lib) on LD_LIBRARY_PATH",
                    tried));
  }();
  return lib;
}

// The library's `name`, of the type its header declares.
template <class F>
F cublaslt_entry(const char* name) {
  void* p = dlsym(cublaslt_library(), name);
  if (!p)
    throw moecore::Error(
        fmt::format("the loaded libcublasLt has no {}: a cuBLASLt {} is needed", name, CUBLAS_VER_MAJOR));
  return reinterpret_cast<F>(p);
}

}  // namespace

// Each definition looks its entry up once; a C function of the same name with other parameters does not compile.
#define MOECORE_CUBLASLT_REAL(name) static const auto real = cublaslt_entry<decltype(&::name)>(#name)

extern "C" {

cublasStatus_t CUBLASWINAPI cublasLtCreate(cublasLtHandle_t* handle) {
  MOECORE_CUBLASLT_REAL(cublasLtCreate);
  return real(handle);
}

cublasStatus_t CUBLASWINAPI cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, const void* alpha,
                                           const void* A, cublasLtMatrixLayout_t Adesc, const void* B,
                                           cublasLtMatrixLayout_t Bdesc, const void* beta, const void* C,
                                           cublasLtMatrixLayout_t Cdesc, void* D, cublasLtMatrixLayout_t Ddesc,
                                           const cublasLtMatmulAlgo_t* algo, void* workspace, size_t workspace_bytes,
                                           cudaStream_t stream) {
  MOECORE_CUBLASLT_REAL(cublasLtMatmul);
  return real(handle, desc, alpha, A, Adesc, B, Bdesc, beta, C, Cdesc, D, Ddesc, algo, workspace, workspace_bytes,
              stream);
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                                           cublasLtMatrixLayout_t Adesc, cublasLtMatrixLayout_t Bdesc,
                                                           cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
                                                           cublasLtMatmulPreference_t preference, int requested,
                                                           cublasLtMatmulHeuristicResult_t results[], int* returned) {
  MOECORE_CUBLASLT_REAL(cublasLtMatmulAlgoGetHeuristic);
  return real(handle, desc, Adesc, Bdesc, Cdesc, Ddesc, preference, requested, results, returned);
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute,
                                                     cudaDataType_t scale) {
  MOECORE_CUBLASLT_REAL(cublasLtMatmulDescCreate);
  return real(desc, compute, scale);
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc,
                                                           cublasLtMatmulDescAttributes_t attr, const void* buf,
                                                           size_t bytes) {
  MOECORE_CUBLASLT_REAL(cublasLtMatmulDescSetAttribute);
  return real(desc, attr, buf, bytes);
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
  MOECORE_CUBLASLT_REAL(cublasLtMatmulPreferenceCreate);
  return real(pref);
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  MOECORE_CUBLASLT_REAL(cublasLtMatmulPreferenceDestroy);
  return real(pref);
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                                 cublasLtMatmulPreferenceAttributes_t attr,
                                                                 const void* buf, size_t bytes) {
  MOECORE_CUBLASLT_REAL(cublasLtMatmulPreferenceSetAttribute);
  return real(pref, attr, buf, bytes);
}

cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType type, uint64_t rows,
                                                       uint64_t cols, int64_t ld) {
  MOECORE_CUBLASLT_REAL(cublasLtMatrixLayoutCreate);
  return real(layout, type, rows, cols, ld);
}

cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t layout,
                                                             cublasLtMatrixLayoutAttribute_t attr, const void* buf,
                                                             size_t bytes) {
  MOECORE_CUBLASLT_REAL(cublasLtMatrixLayoutSetAttribute);
  return real(layout, attr, buf, bytes);
}

}  // extern "C"
