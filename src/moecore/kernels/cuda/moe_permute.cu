// MoE token permutation on the GPU (launch_moe.h): the dispatch plan from a stable CUB radix sort of the assignments
// by expert, row gathers/scatters with 16-byte accesses, and the per-token ordered sum (one block per token walking
// its rows in ascending expert order). No floating-point atomics anywhere: every output has one writer and every
// sum a fixed order, so reruns are bitwise identical (and the sums equal the CPU's, which add in the same order).
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>

#include "moecore/device/check.h"
#include "moecore/kernels/cuda/common.cuh"
#include "moecore/kernels/cuda/launch_moe.h"

namespace moecore::launch {

namespace {

int key_bits(int64_t E) {  // bits that hold every key 0..E (E is the "no row" key)
  int b = 1;
  while ((int64_t{1} << b) <= E) b++;
  return b;
}

__global__ void make_keys_kernel(const int32_t* idx, int64_t n, int64_t E, uint32_t* keys, int32_t* vals) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int32_t e = idx[i];
    keys[i] = e >= 0 && e < E ? static_cast<uint32_t>(e) : static_cast<uint32_t>(E);
    vals[i] = static_cast<int32_t>(i);
  }
}

__device__ int64_t lower_bound(const uint32_t* keys, int64_t n, uint32_t v) {
  int64_t lo = 0, hi = n;
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    if (keys[mid] < v)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

// counts[e] = rows of expert e, read off the sorted keys (one thread per expert, no atomics).
__global__ void expert_counts_kernel(const uint32_t* sorted_keys, int64_t n, int64_t E, int64_t* counts) {
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < E; e += int64_t(gridDim.x) * blockDim.x)
    counts[e] = lower_bound(sorted_keys, n, static_cast<uint32_t>(e + 1)) -
                lower_bound(sorted_keys, n, static_cast<uint32_t>(e));
}

__global__ void build_rows_kernel(const int32_t* sorted_i, int64_t R, int64_t K, int32_t* row_token, int64_t* row_tk,
                                  int32_t* row_of_i) {
  for (int64_t r = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; r < R; r += int64_t(gridDim.x) * blockDim.x) {
    const int32_t i = sorted_i[r];
    row_token[r] = static_cast<int32_t>(i / K);
    row_tk[r] = i;
    row_of_i[i] = static_cast<int32_t>(r);
  }
}

__global__ void token_counts_kernel(const int32_t* row_of_i, int64_t T, int64_t K, int64_t* counts,
                                    int64_t* offsets_T1) {
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < T; t += int64_t(gridDim.x) * blockDim.x) {
    int64_t c = 0;
    for (int64_t j = 0; j < K; j++) c += row_of_i[t * K + j] >= 0;
    counts[t] = c;
    if (t == 0) offsets_T1[0] = 0;
  }
}

// r inserted into the ascending rows[0, c) (c + 1 rows after).
__device__ __forceinline__ void insert_row(int32_t* rows, int c, int32_t r) {
  int p = c;
  while (p > 0 && rows[p - 1] > r) {
    rows[p] = rows[p - 1];
    p--;
  }
  rows[p] = r;
}

// Each token's rows in ascending order (insertion sort of its at most K rows): in registers up to kMoeMaxTopK, in
// the token's own slots of token_rows above (a top-k Megatron allows up to the expert count); the same order.
__global__ void token_rows_kernel(const int32_t* row_of_i, int64_t T, int64_t K, const int64_t* offsets_T1,
                                  int32_t* token_rows) {
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < T; t += int64_t(gridDim.x) * blockDim.x) {
    int32_t* out = token_rows + offsets_T1[t];
    int c = 0;
    if (K > kMoeMaxTopK) {
      for (int64_t j = 0; j < K; j++)
        if (row_of_i[t * K + j] >= 0) insert_row(out, c++, row_of_i[t * K + j]);
      continue;
    }
    int32_t rows[kMoeMaxTopK];
    for (int64_t j = 0; j < K; j++)
      if (row_of_i[t * K + j] >= 0) insert_row(rows, c++, row_of_i[t * K + j]);
    for (int k = 0; k < c; k++) out[k] = rows[k];
  }
}

// One block per row (grid-stride over rows), threads over the row's words of type W.
template <typename W>
__global__ void gather_rows_kernel(const W* src, const int32_t* idx, W* dst, int64_t R, int64_t words) {
  for (int64_t r = blockIdx.x; r < R; r += gridDim.x) {
    const int64_t s = idx[r];
    W* d = dst + r * words;
    if (s < 0) {
      for (int64_t w = threadIdx.x; w < words; w += blockDim.x) d[w] = W{};
    } else {
      const W* in = src + s * words;
      for (int64_t w = threadIdx.x; w < words; w += blockDim.x) d[w] = in[w];
    }
  }
}

template <typename W>
__global__ void scatter_rows_kernel(const W* src, const int32_t* idx, W* dst, int64_t R, int64_t words) {
  for (int64_t r = blockIdx.x; r < R; r += gridDim.x) {
    const W* in = src + r * words;
    W* d = dst + static_cast<int64_t>(idx[r]) * words;
    for (int64_t w = threadIdx.x; w < words; w += blockDim.x) d[w] = in[w];
  }
}

__global__ void gather_rows_bf16_kernel(const float* src, const int32_t* idx, __nv_bfloat16* dst, int64_t R,
                                        int64_t H) {
  for (int64_t r = blockIdx.x; r < R; r += gridDim.x) {
    const int64_t s = idx[r];
    __nv_bfloat16* d = dst + r * H;
    for (int64_t h = threadIdx.x; h < H; h += blockDim.x)
      d[h] = s < 0 ? __float2bfloat16_rn(0.0f) : __float2bfloat16_rn(src[s * H + h]);
  }
}

// A token's rows summed column by column in row order, starting from 0 as the CPU loop does.
template <typename V>
__device__ __forceinline__ void add_to(V& a, const V& b);
template <>
__device__ __forceinline__ void add_to<float>(float& a, const float& b) {
  a += b;
}
template <>
__device__ __forceinline__ void add_to<float4>(float4& a, const float4& b) {
  a.x += b.x, a.y += b.y, a.z += b.z, a.w += b.w;
}

template <typename V>
__global__ void sum_rows_kernel(const V* src, const int64_t* offsets, const int32_t* rows, V* dst, int64_t T,
                                int64_t words) {
  for (int64_t t = blockIdx.x; t < T; t += gridDim.x) {
    const int64_t b = offsets[t], e = offsets[t + 1];
    for (int64_t w = threadIdx.x; w < words; w += blockDim.x) {
      V acc{};
      for (int64_t i = b; i < e; i++) add_to(acc, src[static_cast<int64_t>(rows[i]) * words + w]);
      dst[t * words + w] = acc;
    }
  }
}

// The same sum over bf16 rows into f32 (each bf16 widened exactly as it is read, the sum in f32 from 0, as the CPU's
// sum_token_rows): the experts' bf16 outputs are combined without a cast pass. 8 columns per thread (one 16-byte
// load of bf16, two 16-byte stores of f32) where the row and both bases allow, else one.
__global__ void sum_rows_bf16x8_kernel(const uint4* src, const int64_t* offsets, const int32_t* rows, float4* dst,
                                       int64_t T, int64_t words) {
  for (int64_t t = blockIdx.x; t < T; t += gridDim.x) {
    const int64_t b = offsets[t], e = offsets[t + 1];
    for (int64_t w = threadIdx.x; w < words; w += blockDim.x) {
      float acc[8] = {};
      for (int64_t i = b; i < e; i++) {
        const uint4 v = src[static_cast<int64_t>(rows[i]) * words + w];
        const auto* pair = reinterpret_cast<const __nv_bfloat162*>(&v);
        for (int k = 0; k < 4; k++) {
          const float2 f = __bfloat1622float2(pair[k]);
          acc[2 * k] += f.x;
          acc[2 * k + 1] += f.y;
        }
      }
      dst[2 * (t * words + w)] = make_float4(acc[0], acc[1], acc[2], acc[3]);
      dst[2 * (t * words + w) + 1] = make_float4(acc[4], acc[5], acc[6], acc[7]);
    }
  }
}

__global__ void sum_rows_bf16_kernel(const __nv_bfloat16* src, const int64_t* offsets, const int32_t* rows, float* dst,
                                     int64_t T, int64_t H) {
  for (int64_t t = blockIdx.x; t < T; t += gridDim.x) {
    const int64_t b = offsets[t], e = offsets[t + 1];
    for (int64_t h = threadIdx.x; h < H; h += blockDim.x) {
      float acc = 0.0f;
      for (int64_t i = b; i < e; i++) acc += __bfloat162float(src[static_cast<int64_t>(rows[i]) * H + h]);
      dst[t * H + h] = acc;
    }
  }
}

__global__ void gather_probs_kernel(const float* probs, const int64_t* row_tk, float* out, int64_t R) {
  for (int64_t r = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; r < R; r += int64_t(gridDim.x) * blockDim.x)
    out[r] = row_tk[r] >= 0 ? probs[row_tk[r]] : 0.0f;
}

__global__ void scatter_probs_kernel(const float* dprobs_R, const int64_t* row_tk, float* dprobs_TK, int64_t R) {
  for (int64_t r = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; r < R; r += int64_t(gridDim.x) * blockDim.x)
    if (row_tk[r] >= 0) dprobs_TK[row_tk[r]] = dprobs_R[r];
}

bool aligned(const void* p, int64_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % static_cast<uintptr_t>(bytes) == 0;
}

// The widest word (16, 4, 2 or 1 bytes) that divides the row and both base addresses.
int64_t word_bytes(const void* a, const void* b, int64_t row_bytes) {
  for (int64_t w : {16, 4, 2})
    if (row_bytes % w == 0 && aligned(a, w) && aligned(b, w)) return w;
  return 1;
}

int row_threads(int64_t words) {
  return words >= 256 ? 256 : words >= 128 ? 128 : 64;
}

unsigned row_grid(int64_t rows) {
  return static_cast<unsigned>(rows < 1 ? 1 : rows > 65535 * 4 ? 65535 * 4 : rows);
}

}  // namespace

size_t moe_sort_scratch_bytes(int64_t n, int64_t E) {
  size_t bytes = 0;
  MOE_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, bytes, static_cast<const uint32_t*>(nullptr),
                                                 static_cast<uint32_t*>(nullptr), static_cast<const int32_t*>(nullptr),
                                                 static_cast<int32_t*>(nullptr), static_cast<int>(n), 0, key_bits(E)));
  return bytes;
}

void moe_sort_assignments(const int32_t* idx, int64_t n, int64_t E, uint32_t* keys_in, uint32_t* keys_out,
                          int32_t* vals_in, int32_t* sorted_i, int64_t* counts_E, void* scratch, size_t scratch_bytes,
                          cudaStream_t s) {
  if (n > 0) {
    make_keys_kernel<<<grid_for(n), kThreads, 0, s>>>(idx, n, E, keys_in, vals_in);
    size_t bytes = scratch_bytes;
    // Radix sort is stable: equal experts keep ascending assignment index, i.e. ascending token.
    MOE_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(scratch, bytes, keys_in, keys_out, vals_in, sorted_i,
                                                   static_cast<int>(n), 0, key_bits(E), s));
  }
  expert_counts_kernel<<<grid_for(E), kThreads, 0, s>>>(keys_out, n, E, counts_E);
}

void moe_build_rows(const int32_t* sorted_i, int64_t n, int64_t R, int64_t K, int32_t* row_token, int64_t* row_tk,
                    int32_t* row_of_i, cudaStream_t s) {
  if (n > 0) MOE_CUDA_CHECK(cudaMemsetAsync(row_of_i, 0xFF, static_cast<size_t>(n) * sizeof(int32_t), s));  // −1
  if (R > 0) build_rows_kernel<<<grid_for(R), kThreads, 0, s>>>(sorted_i, R, K, row_token, row_tk, row_of_i);
}

size_t moe_csr_scratch_bytes(int64_t T) {
  size_t bytes = 0;
  MOE_CUDA_CHECK(cub::DeviceScan::InclusiveSum(nullptr, bytes, static_cast<const int64_t*>(nullptr),
                                               static_cast<int64_t*>(nullptr), static_cast<int>(T < 1 ? 1 : T)));
  return bytes;
}

void moe_token_csr(const int32_t* row_of_i, int64_t T, int64_t K, int64_t* counts_T, int64_t* offsets_T1,
                   int32_t* token_rows, void* scratch, size_t scratch_bytes, cudaStream_t s) {
  if (T == 0) {
    MOE_CUDA_CHECK(cudaMemsetAsync(offsets_T1, 0, sizeof(int64_t), s));
    return;
  }
  token_counts_kernel<<<grid_for(T), kThreads, 0, s>>>(row_of_i, T, K, counts_T, offsets_T1);
  size_t bytes = scratch_bytes;
  MOE_CUDA_CHECK(cub::DeviceScan::InclusiveSum(scratch, bytes, counts_T, offsets_T1 + 1, static_cast<int>(T), s));
  token_rows_kernel<<<grid_for(T), kThreads, 0, s>>>(row_of_i, T, K, offsets_T1, token_rows);
}

void moe_gather_rows(const void* src, const int32_t* idx, void* dst, int64_t R, int64_t row_bytes, cudaStream_t s) {
  if (R == 0 || row_bytes == 0) return;
  const int64_t w = word_bytes(src, dst, row_bytes), words = row_bytes / w;
  const unsigned g = row_grid(R);
  const int th = row_threads(words);
  if (w == 16)
    gather_rows_kernel<<<g, th, 0, s>>>(static_cast<const uint4*>(src), idx, static_cast<uint4*>(dst), R, words);
  else if (w == 4)
    gather_rows_kernel<<<g, th, 0, s>>>(static_cast<const uint32_t*>(src), idx, static_cast<uint32_t*>(dst), R, words);
  else if (w == 2)
    gather_rows_kernel<<<g, th, 0, s>>>(static_cast<const uint16_t*>(src), idx, static_cast<uint16_t*>(dst), R, words);
  else
    gather_rows_kernel<<<g, th, 0, s>>>(static_cast<const uint8_t*>(src), idx, static_cast<uint8_t*>(dst), R, words);
}

void moe_gather_rows_f32_to_bf16(const float* src, const int32_t* idx, void* dst, int64_t R, int64_t H,
                                 cudaStream_t s) {
  if (R == 0 || H == 0) return;
  gather_rows_bf16_kernel<<<row_grid(R), row_threads(H), 0, s>>>(src, idx, static_cast<__nv_bfloat16*>(dst), R, H);
}

void moe_scatter_rows(const void* src, const int32_t* idx, void* dst, int64_t R, int64_t row_bytes, cudaStream_t s) {
  if (R == 0 || row_bytes == 0) return;
  const int64_t w = word_bytes(src, dst, row_bytes), words = row_bytes / w;
  const unsigned g = row_grid(R);
  const int th = row_threads(words);
  if (w == 16)
    scatter_rows_kernel<<<g, th, 0, s>>>(static_cast<const uint4*>(src), idx, static_cast<uint4*>(dst), R, words);
  else if (w == 4)
    scatter_rows_kernel<<<g, th, 0, s>>>(static_cast<const uint32_t*>(src), idx, static_cast<uint32_t*>(dst), R, words);
  else if (w == 2)
    scatter_rows_kernel<<<g, th, 0, s>>>(static_cast<const uint16_t*>(src), idx, static_cast<uint16_t*>(dst), R, words);
  else
    scatter_rows_kernel<<<g, th, 0, s>>>(static_cast<const uint8_t*>(src), idx, static_cast<uint8_t*>(dst), R, words);
}

void moe_sum_rows_per_token(const void* src, bool src_bf16, const int64_t* offsets_T1, const int32_t* rows, float* dst,
                            int64_t T, int64_t H, cudaStream_t s) {
  if (T == 0 || H == 0) return;
  if (src_bf16) {
    const auto* src16 = static_cast<const __nv_bfloat16*>(src);
    if (H % 8 == 0 && aligned(src, 16) && aligned(dst, 16)) {
      const int64_t words = H / 8;
      sum_rows_bf16x8_kernel<<<row_grid(T), row_threads(words), 0, s>>>(static_cast<const uint4*>(src), offsets_T1,
                                                                        rows, reinterpret_cast<float4*>(dst), T, words);
    } else {
      sum_rows_bf16_kernel<<<row_grid(T), row_threads(H), 0, s>>>(src16, offsets_T1, rows, dst, T, H);
    }
    return;
  }
  const auto* src32 = static_cast<const float*>(src);
  if (H % 4 == 0 && aligned(src, 16) && aligned(dst, 16)) {
    const int64_t words = H / 4;
    sum_rows_kernel<<<row_grid(T), row_threads(words), 0, s>>>(reinterpret_cast<const float4*>(src32), offsets_T1, rows,
                                                               reinterpret_cast<float4*>(dst), T, words);
  } else {
    sum_rows_kernel<<<row_grid(T), row_threads(H), 0, s>>>(src32, offsets_T1, rows, dst, T, H);
  }
}

void moe_gather_probs(const float* probs_TK, const int64_t* row_tk, float* probs_R, int64_t R, cudaStream_t s) {
  if (R > 0) gather_probs_kernel<<<grid_for(R), kThreads, 0, s>>>(probs_TK, row_tk, probs_R, R);
}

void moe_scatter_probs(const float* dprobs_R, const int64_t* row_tk, float* dprobs_TK, int64_t R, cudaStream_t s) {
  if (R > 0) scatter_probs_kernel<<<grid_for(R), kThreads, 0, s>>>(dprobs_R, row_tk, dprobs_TK, R);
}

}  // namespace moecore::launch
