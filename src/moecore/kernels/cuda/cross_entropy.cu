// Cross-entropy kernels (see launch.h): one block per row, fixed-order block reductions. The logits are f32 and
// read in place: forward reads them twice (max, then Σexp), backward writes dlogits; nothing else of size T·V.
#include <cfloat>

#include "moecore/kernels/cuda/common.cuh"
#include "moecore/kernels/cuda/launch.h"

namespace moecore::launch {

namespace {
__global__ void row_max_k(const float* l, int64_t V, float* mx) {
  __shared__ float sm[kThreads];
  const float* r = l + blockIdx.x * V;
  float m = -INFINITY;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) m = fmaxf(m, r[v]);
  m = block_max(m, sm);
  if (threadIdx.x == 0) mx[blockIdx.x] = m;
}

__global__ void sumexp_target_k(const float* l, const void* targets, bool t64, int64_t rows, int64_t V,
                                int64_t vocab_start, const float* mx, float* sums) {
  __shared__ float sm[kThreads];
  const int64_t t = blockIdx.x;
  const float* r = l + t * V;
  const float m = mx[t];
  float s = 0;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) s += expf(r[v] - m);
  s = block_sum(s, sm);
  if (threadIdx.x == 0) {
    sums[t] = s;
    const int64_t c = id_at(targets, t64, t) - vocab_start;
    sums[rows + t] = c >= 0 && c < V ? r[c] : 0.0f;
  }
}

__global__ void finish_k(const float* mx, const float* sums, int64_t rows, float* lse, float* loss) {
  const int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (t >= rows) return;
  lse[t] = mx[t] + logf(sums[t]);
  loss[t] = lse[t] - sums[rows + t];
}

__global__ void backward_k(const float* dloss, const float* l, const void* targets, bool t64, const float* lse,
                           float* d, int64_t V, int64_t vocab_start) {
  const int64_t t = blockIdx.x;
  const float g = dloss[t], m = lse[t];
  const int64_t c = id_at(targets, t64, t) - vocab_start;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
    float x = expf(l[t * V + v] - m) * g;
    if (v == c) x -= g;
    d[t * V + v] = x;
  }
}
}  // namespace

void ce_row_max(const float* logits, int64_t rows, int64_t V, float* mx, cudaStream_t s) {
  if (rows > 0) row_max_k<<<static_cast<unsigned>(rows), kThreads, 0, s>>>(logits, V, mx);
}
void ce_sumexp_target(const float* logits, const void* targets, bool t64, int64_t rows, int64_t V, int64_t vocab_start,
                      const float* mx, float* sums, cudaStream_t s) {
  if (rows > 0)
    sumexp_target_k<<<static_cast<unsigned>(rows), kThreads, 0, s>>>(logits, targets, t64, rows, V, vocab_start, mx,
                                                                     sums);
}
void ce_finish(const float* mx, const float* sums, int64_t rows, float* lse, float* loss, cudaStream_t s) {
  if (rows > 0) finish_k<<<grid_for(rows), kThreads, 0, s>>>(mx, sums, rows, lse, loss);
}
void ce_backward(const float* dloss, const float* logits, const void* targets, bool t64, const float* lse,
                 float* dlogits, int64_t rows, int64_t V, int64_t vocab_start, cudaStream_t s) {
  if (rows > 0)
    backward_k<<<static_cast<unsigned>(rows), kThreads, 0, s>>>(dloss, logits, targets, t64, lse, dlogits, V,
                                                                vocab_start);
}

}  // namespace moecore::launch
