// Capacity dropping of the MoE router on the GPU (see launch_router.h): one block per expert. The block first
// gathers the expert's assignments in token order with a block-wide scan (integers: the order is exact), then ranks
// each one by the CPU router's rule (kernels/cpu/router.cpp capacity_impl), then applies the decisions. A token
// holds at most one assignment per expert (top-k picks distinct experts), so an expert has at most T of them.
#include "moecore/kernels/cuda/common.cuh"
#include "moecore/kernels/cuda/launch_router.h"

namespace moecore::launch {

namespace {

// Inclusive scans of two flags over the block (Hillis–Steele in shared memory).
__device__ void scan2(int* a, int* b) {
  for (int off = 1; off < blockDim.x; off <<= 1) {
    const int x = threadIdx.x >= off ? a[threadIdx.x - off] : 0;
    const int y = threadIdx.x >= off ? b[threadIdx.x - off] : 0;
    __syncthreads();
    a[threadIdx.x] += x;
    b[threadIdx.x] += y;
    __syncthreads();
  }
}

__global__ void capacity_k(const int32_t* idx, float* P, int32_t* kept, int64_t T, int64_t K, int64_t C,
                           bool by_position, bool pad, int32_t* list, int32_t* work) {
  __shared__ int sa[kThreads], sb[kThreads];
  const int64_t e = blockIdx.x, TK = T * K;
  int32_t* L = list + e * T;  // assignment index t·K + j, ascending
  int32_t* W = work + e * T;  // positive assignments before it in L, then the drop decision
  int64_t n = 0, npos = 0;
  // 1. Gather, in token order, with the count of positive-probability assignments before each.
  for (int64_t base = 0; base < TK; base += blockDim.x) {
    const int64_t i = base + threadIdx.x;
    const int f = i < TK && idx[i] == e;
    const int fp = f && P[i] > 0.0f;
    sa[threadIdx.x] = f;
    sb[threadIdx.x] = fp;
    __syncthreads();
    scan2(sa, sb);
    if (f) {
      const int64_t r = n + sa[threadIdx.x] - 1;
      if (r < T) {
        L[r] = static_cast<int32_t>(i);
        W[r] = static_cast<int32_t>(npos + sb[threadIdx.x] - fp);
      }
    }
    n += sa[blockDim.x - 1];
    npos += sb[blockDim.x - 1];
    __syncthreads();
  }
  if (n > T) n = T;  // cannot happen (distinct picks per token); keeps the scratch in bounds
  // 2. Decide (reads only; each thread writes the W entries it alone reads).
  for (int64_t r = threadIdx.x; r < n; r += blockDim.x) {
    const int64_t i = L[r];
    bool drop;
    if (by_position) {  // routed tokens first, earliest first
      drop = r >= C;
    } else if (npos > C) {  // the C largest probabilities, ties to the earlier token; every zero one is dropped
      const float pi = P[i];
      int64_t rank = 0;
      for (int64_t q = 0; q < n && rank < C; q++) {
        const float pq = P[L[q]];
        rank += pq > pi || (pq == pi && q < r);
      }
      drop = rank >= C;
    } else if (P[i] > 0.0f) {  // every positive one is kept
      drop = false;
    } else {  // a zero one ranks after the positive ones, in token order among the zero (or padding) ones
      const int64_t pos_before = W[r], t = i / K;
      const int64_t rank = npos + (pad ? t - pos_before : r - pos_before);
      drop = rank >= C;
    }
    W[r] = drop ? 1 : 0;
  }
  __syncthreads();
  // 3. Apply.
  for (int64_t r = threadIdx.x; r < n; r += blockDim.x)
    if (W[r]) {
      kept[L[r]] = 0;
      P[L[r]] = 0.0f;
    }
}

}  // namespace

void router_capacity(const int32_t* idx, float* probs, int32_t* kept, int64_t T, int64_t E, int64_t K, int64_t C,
                     bool by_position, bool pad, int32_t* list_ET, int32_t* work_ET, cudaStream_t s) {
  if (E > 0 && T > 0)
    capacity_k<<<static_cast<unsigned>(E), kThreads, 0, s>>>(idx, probs, kept, T, K, C, by_position, pad, list_ET,
                                                             work_ET);
}

}  // namespace moecore::launch
