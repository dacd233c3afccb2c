// The pointer-level launcher of the GPU dtype conversion (convert.cu), called by runtime_cuda.cpp's
// convert_on_device. CUDA headers only, like kernels/cuda/launch.h.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace moecore::launch {

// n elements from src (dtype code src_dtype) to dst (dst_dtype), codes as moecore::DType's values (0 f32, 1 bf16,
// 2 f64); bf16 results rounded to nearest even. Queued on `s`.
void convert(void* dst, int dst_dtype, const void* src, int src_dtype, int64_t n, cudaStream_t s);

}  // namespace moecore::launch
