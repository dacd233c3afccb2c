// The embedding's weight gradient on the GPU (see launch.h): dW[r] += Σ_{t: id[t] − vocab_start = r} dy[t], tokens in
// ascending order as the CPU kernel adds them, so the bits are the CPU's. The tokens are sorted by row first (CUB's
// stable radix sort), then one block per run of equal rows adds that run's dy rows into its dW row, all columns in
// parallel. Before, one thread per column walked every token (H threads over T tokens).
#include <cub/device/device_radix_sort.cuh>

#include "moecore/device/check.h"
#include "moecore/kernels/cuda/common.cuh"
#include "moecore/kernels/cuda/launch.h"

namespace moecore::launch {

namespace {
int row_key_bits(int64_t VL) {  // bits that hold every key 0..VL (VL: "not in this shard")
  int b = 1;
  while ((int64_t{1} << b) <= VL) b++;
  return b;
}

__global__ void row_keys_k(const void* ids, bool ids64, int64_t T, int64_t VL, int64_t vocab_start, uint32_t* keys,
                           int32_t* tokens) {
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < T; t += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = id_at(ids, ids64, t) - vocab_start;
    keys[t] = static_cast<uint32_t>(r >= 0 && r < VL ? r : VL);
    tokens[t] = static_cast<int32_t>(t);
  }
}

// Block p (of the sorted positions) owns the run of equal keys that starts at p, if one does; the run's tokens are
// in ascending order (the sort is stable), and each thread adds them into its columns of the row in that order.
__global__ void add_runs_k(const float* dy, const uint32_t* keys, const int32_t* tokens, float* dw, int64_t T,
                           int64_t H, int64_t VL) {
  for (int64_t p = blockIdx.x; p < T; p += gridDim.x) {
    const uint32_t key = keys[p];
    if (key == static_cast<uint32_t>(VL) || (p > 0 && keys[p - 1] == key)) continue;
    float* row = dw + static_cast<int64_t>(key) * H;
    for (int64_t j = threadIdx.x; j < H; j += blockDim.x) {
      float acc = row[j];
      for (int64_t q = p; q < T && keys[q] == key; q++) acc += dy[static_cast<int64_t>(tokens[q]) * H + j];
      row[j] = acc;
    }
  }
}
}  // namespace

size_t embedding_sort_scratch_bytes(int64_t T, int64_t VL) {
  size_t bytes = 0;
  MOE_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
      nullptr, bytes, static_cast<const uint32_t*>(nullptr), static_cast<uint32_t*>(nullptr),
      static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr), static_cast<int>(T), 0, row_key_bits(VL)));
  return bytes;
}

void embedding_backward(const float* dy, const void* ids, bool ids64, float* dw, int64_t T, int64_t H, int64_t VL,
                        int64_t vocab_start, int32_t* order_scratch, void* sort_scratch, size_t sort_bytes,
                        cudaStream_t s) {
  if (T <= 0 || H <= 0) return;
  uint32_t* keys_in = reinterpret_cast<uint32_t*>(order_scratch);
  uint32_t* keys_out = keys_in + T;
  int32_t* tokens_in = order_scratch + 2 * T;
  int32_t* tokens_out = order_scratch + 3 * T;
  row_keys_k<<<grid_for(T), kThreads, 0, s>>>(ids, ids64, T, VL, vocab_start, keys_in, tokens_in);
  size_t bytes = sort_bytes;
  MOE_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(sort_scratch, bytes, keys_in, keys_out, tokens_in, tokens_out,
                                                 static_cast<int>(T), 0, row_key_bits(VL), s));
  const unsigned blocks = static_cast<unsigned>(T < 65535LL * 8 ? T : 65535LL * 8);
  add_runs_k<<<blocks, kThreads, 0, s>>>(dy, keys_out, tokens_out, dw, T, H, VL);
}

}  // namespace moecore::launch
