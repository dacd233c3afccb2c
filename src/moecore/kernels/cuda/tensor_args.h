// Operand checks shared by the Tensor-level CUDA entry points (kernels.cpp, kernels_loss_optim.cpp, attention_ops.cpp).
#pragma once

#include <cuda_runtime_api.h>

#include "moecore/core/tensor.h"
#include "moecore/device/check.h"

namespace moecore::kernels::cuda::detail {

// The address of an f32 operand that lives on a GPU (asserted, naming the operand).
inline float* f32(const Tensor& t, const char* name) {
  MOE_ASSERT_MSG(t.device().is_cuda(), "{} is on {}, but the kernel runs on the GPU: move it with .to(Device)", name,
                 t.device().str());
  MOE_ASSERT_MSG(t.dtype() == DType::F32, "the CUDA kernels compute in f32; {} is {}", name, dtype_name(t.dtype()));
  return t.device_data<float>();
}

// Token ids or labels on the GPU: true when i64, false when i32.
inline bool ids64(const Tensor& ids) {
  MOE_ASSERT(ids.dtype() == DType::I32 || ids.dtype() == DType::I64);
  MOE_ASSERT_MSG(ids.device().is_cuda(), "token ids are on {}, the kernel runs on the GPU", ids.device().str());
  return ids.dtype() == DType::I64;
}

// After a launch: a bad configuration surfaces here, naming the kernel.
inline void check_launch(const char* what) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) moecore::device::throw_cuda_error(what, e, __FILE__, __LINE__);
}

}  // namespace moecore::kernels::cuda::detail
