// The merge of two partial attention results over disjoint key sets (launch_attention_tc.h attention_merge; context
// parallelism's online softmax across blocks), with the CPU's f32 formula (kernels/cpu/attention_flash_block.cpp):
//   lse = mx + log(e^(lse₁−mx) + e^(lse₂−mx)), o = c₁·o₁ + c₂·o₂ with c_k = e^(lse_k−mx) / Σ, mx = max(lse₁, lse₂).
// Two kernels so that no thread reads a row's lse after another has rewritten it: the outputs element by element
// (each thread derives its row's weights from the old lse pair), then the lse row by row. Not the attention itself.
#include <cmath>

#include "moecore/kernels/cuda/common.cuh"
#include "moecore/kernels/cuda/launch_attention_tc.h"

namespace moecore::launch {

namespace {
constexpr int kMergeThreads = 256;

// o element (s, bn, e) from the old (lse, lse_part) of row (bn, s).
__global__ void merge_o_k(float* o, const float* lse, const float* o_part, const float* lse_part, int64_t S, int64_t BN,
                          int64_t D) {
  const int64_t n = S * BN * D;
  for (int64_t x = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; x < n; x += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = x / D, s = row / BN, bn = row % BN;
    const float l1 = lse[bn * S + s], l2 = lse_part[bn * S + s];
    if (l2 == -INFINITY) continue;  // the part saw no key: the row stays
    if (l1 == -INFINITY) {          // the row saw no key yet: it becomes the part
      o[x] = o_part[x];
      continue;
    }
    const float mx = fmaxf(l1, l2), w1 = expf(l1 - mx), w2 = expf(l2 - mx), sum = w1 + w2;
    const float c1 = w1 / sum, c2 = w2 / sum;
    o[x] = c1 * o[x] + c2 * o_part[x];
  }
}

__global__ void merge_lse_k(float* lse, const float* lse_part, int64_t rows) {
  for (int64_t r = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; r < rows; r += int64_t(gridDim.x) * blockDim.x) {
    const float l1 = lse[r], l2 = lse_part[r];
    if (l2 == -INFINITY) continue;
    if (l1 == -INFINITY) {
      lse[r] = l2;
      continue;
    }
    const float mx = fmaxf(l1, l2), sum = expf(l1 - mx) + expf(l2 - mx);
    lse[r] = mx + logf(sum);
  }
}

}  // namespace

void attention_merge(float* o, float* lse, const float* o_part, const float* lse_part, int64_t S, int64_t BN, int64_t D,
                     cudaStream_t s) {
  const int64_t n = S * BN * D, rows = S * BN;
  if (n == 0) return;
  const unsigned elem_grid = grid_for(n, kMergeThreads), row_grid = grid_for(rows, kMergeThreads);
  merge_o_k<<<elem_grid, kMergeThreads, 0, s>>>(o, lse, o_part, lse_part, S, BN, D);
  merge_lse_k<<<row_grid, kMergeThreads, 0, s>>>(lse, lse_part, rows);
}

}  // namespace moecore::launch
