// The grouped expert GEMMs' pointer arrays, written on the device from the problem list (see launch_grouped.h): one
// thread per problem and operand, no host-to-device copy. Not the GEMMs themselves (grouped_gemm.cpp, cuBLAS).
#include "moecore/kernels/cuda/common.cuh"
#include "moecore/kernels/cuda/launch_grouped.h"

namespace moecore::launch {

namespace {
__global__ void grouped_ptrs_k(GroupedPtrArgs a, void** out, int64_t G, int64_t first) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= 3 * a.count) return;
  const int o = i / a.count, g = i % a.count;
  out[o * G + first + g] =
      const_cast<char*>(a.base[o] + a.row[g] * a.row_stride[o] + int64_t{a.expert[g]} * a.expert_stride[o]);
}
}  // namespace

void grouped_gemm_pointers(const GroupedPtrArgs& args, void** out, int64_t G, int64_t first, cudaStream_t s) {
  if (args.count > 0) grouped_ptrs_k<<<grid_for(3 * args.count), kThreads, 0, s>>>(args, out, G, first);
}

}  // namespace moecore::launch
