// The strided GPU copy (runtime.h copy_2d) in a CPU-only build: never reached, since no GPU tensor can exist there.
#include "moecore/cuda/runtime.h"

namespace moecore::cuda {

[[noreturn]] void no_cuda_kernel(const char* name);

void copy_2d(void*, size_t, const void*, size_t, size_t, size_t, Device) {
  no_cuda_kernel("copy_2d (cudaMemcpy2DAsync)");
}

}  // namespace moecore::cuda
