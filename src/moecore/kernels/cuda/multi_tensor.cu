// The multi-tensor optimizer kernels (launch_multi_tensor.h): the gradient norm's sum of squares in two fixed-tree
// stages per tensor and a fixed-order weighted sum over tensors (no atomics: the same bits on every run), the clip
// coefficient and non-finite check in one thread, and AdamW / SGD over many tensors reading the coefficient and the
// skip flag from device memory. Every f64 product and sum of the norm is an explicit _rn operation, so no fused
// multiply-add changes its rounding, and the coefficient is the host's formula, operation for operation. And the
// deferred id checks of the embedding and the cross-entropy (record_bad_id).
#include "moecore/kernels/cuda/common.cuh"
#include "moecore/kernels/cuda/launch_multi_tensor.h"

namespace moecore::launch {

namespace {

__global__ void squares_partial_k(SquaresBatch b, double* partials) {
  __shared__ double sm[kThreads];
  const int k = blockIdx.y;
  const float* a = b.a[k];
  const int64_t n = b.n[k];
  double acc = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const double x = a[i];
    acc = __dadd_rn(acc, __dmul_rn(x, x));
  }
  const double r = block_sum(acc, sm);
  if (threadIdx.x == 0) partials[k * kSquaresBlocks + blockIdx.x] = r;
}

// One block: each tensor's partials summed by the block tree (kSquaresBlocks == kThreads), then weighted and added
// in the batch's order by thread 0.
__global__ void squares_final_k(SquaresBatch b, const double* partials, double* clip) {
  __shared__ double sm[kThreads];
  double part = b.begin_part ? 0.0 : clip[kClipPart];
  for (int k = 0; k < b.count; k++) {
    const double r = block_sum(partials[k * kSquaresBlocks + threadIdx.x], sm);
    part = __dadd_rn(part, __dmul_rn(b.w[k], r));
  }
  if (threadIdx.x != 0) return;
  clip[kClipPart] = part;
  if (b.end_part) clip[kClipTotal] = __dadd_rn(clip[kClipTotal], part);
}

__global__ void squares_reset_k(double* clip) {
  clip[kClipPart] = 0.0;
  clip[kClipTotal] = 0.0;
}

__global__ void clip_finish_k(double* clip, bool use_world_sq, double world_sq, double clip_grad, bool check_finite,
                              int64_t iteration, double* norm_out, const int64_t* id_checks) {
  const double sq = use_world_sq ? world_sq : clip[kClipTotal];
  const double norm = __dsqrt_rn(sq);
  double scale = 1.0;
  if (clip_grad > 0) {
    const double coeff = __ddiv_rn(clip_grad, __dadd_rn(norm, 1e-6));
    if (coeff < 1.0) scale = coeff;
  }
  clip[kClipNorm] = norm;
  clip[kClipScale] = scale;
  bool bad_ids = false;
  for (int k = 0; id_checks && k < kIdCheckKinds; k++) bad_ids |= id_checks[k * kIdCheckSlots] != 0;
  if ((bad_ids || (check_finite && !isfinite(norm))) && clip[kClipSkip] == 0.0) {
    clip[kClipSkip] = 1.0;
    clip[kClipFirstBad] = static_cast<double>(iteration);
  }
  if (norm_out) *norm_out = norm;
}

// One block: the first position whose id is outside [0, V) (a fixed min tree), recorded unless one already is.
__global__ void record_bad_id_k(const void* ids, bool ids64, int64_t n, int64_t V, int64_t* slots, int64_t tag) {
  __shared__ int64_t sm[kThreads];
  if (slots[0] != 0) return;  // the first bad id stays (every thread reads the same value: a uniform return)
  int64_t first = n;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const int64_t id = id_at(ids, ids64, i);
    if ((id < 0 || id >= V) && i < first) first = i;
  }
  sm[threadIdx.x] = first;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s && sm[threadIdx.x + s] < sm[threadIdx.x]) sm[threadIdx.x] = sm[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x != 0 || sm[0] >= n) return;
  slots[1] = sm[0];
  slots[2] = id_at(ids, ids64, sm[0]);
  slots[3] = V;
  slots[4] = tag;
  slots[0] = 1;
}

template <typename M>
__device__ __forceinline__ void store_state(M* p, float x) {
  if constexpr (sizeof(M) == 2)
    *p = __float2bfloat16_rn(x);
  else
    *p = x;
}

// The gradient scale an update applies: the host's `grad_scale`, or the clip state's coefficient; false when the
// clip state says the step is skipped (a non-finite norm or a bad token id).
__device__ inline bool update_scale(const double* clip, float& gs) {
  if (!clip) return true;
  if (clip[kClipSkip] != 0.0) return false;
  gs = static_cast<float>(clip[kClipScale]);
  return true;
}

// elementwise.cu's adamw_k, operation for operation, with the weight decay per tensor and the gradient scale (or
// the skip) read from the clip state.
template <typename M, typename V>
__global__ void adamw_multi_k(AdamWMultiBatch b, AdamWScalars hp, const double* clip) {
  float gs = hp.grad_scale;
  if (!update_scale(clip, gs)) return;
  const int k = blockIdx.y;
  float* p = b.p[k];
  const float* g = b.g[k];
  M* m = static_cast<M*>(b.m[k]);
  V* v = static_cast<V*>(b.v[k]);
  __nv_bfloat16* pb = static_cast<__nv_bfloat16*>(b.p_bf16[k]);
  const float wd = b.wd[k];
  const int64_t n = b.n[k];
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float gi = g[i] * gs;
    const float mi = hp.beta1 * to_f32(m[i]) + (1.0f - hp.beta1) * gi;
    const float vi = hp.beta2 * to_f32(v[i]) + (1.0f - hp.beta2) * gi * gi;
    store_state(m + i, mi);
    store_state(v + i, vi);
    const float mhat = mi / hp.bc1, vhat = vi / hp.bc2;
    const float pi = p[i] * (1.0f - hp.lr * wd) - hp.lr * mhat / (sqrtf(vhat) + hp.eps);
    p[i] = pi;
    if (pb) pb[i] = __float2bfloat16_rn(pi);
  }
}

// elementwise.cu's sgd_k per tensor (every operation rounded on its own: the CPU's bits).
__global__ void sgd_multi_k(AdamWMultiBatch b, float lr, float mom, const double* clip, float grad_scale) {
  float gs = grad_scale;
  if (!update_scale(clip, gs)) return;
  const int k = blockIdx.y;
  float* p = b.p[k];
  const float* g = b.g[k];
  float* buf = static_cast<float*>(b.m[k]);
  __nv_bfloat16* pb = static_cast<__nv_bfloat16*>(b.p_bf16[k]);
  const float wd = b.wd[k];
  const int64_t n = b.n[k];
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float d = __fadd_rn(__fmul_rn(g[i], gs), __fmul_rn(wd, p[i]));
    const float bi = __fadd_rn(__fmul_rn(mom, buf[i]), d);
    buf[i] = bi;
    const float pi = __fsub_rn(p[i], __fmul_rn(lr, bi));
    p[i] = pi;
    if (pb) pb[i] = __float2bfloat16_rn(pi);
  }
}

dim3 multi_grid(const int64_t* n, int count) {
  int64_t most = 1;
  for (int i = 0; i < count; i++) most = n[i] > most ? n[i] : most;
  return dim3(grid_for(most, kThreads, 1024), static_cast<unsigned>(count));
}

}  // namespace

void squares_accumulate(const SquaresBatch& b, double* partials, double* clip, cudaStream_t s) {
  const dim3 grid(kSquaresBlocks, static_cast<unsigned>(b.count));
  if (b.count > 0) squares_partial_k<<<grid, kThreads, 0, s>>>(b, partials);
  squares_final_k<<<1, kThreads, 0, s>>>(b, partials, clip);
}

void squares_reset(double* clip, cudaStream_t s) {
  squares_reset_k<<<1, 1, 0, s>>>(clip);
}

void clip_finish(double* clip, bool use_world_sq, double world_sq, double clip_grad, bool check_finite,
                 int64_t iteration, double* norm_out, const int64_t* id_checks, cudaStream_t s) {
  clip_finish_k<<<1, 1, 0, s>>>(clip, use_world_sq, world_sq, clip_grad, check_finite, iteration, norm_out, id_checks);
}

void record_bad_id(const void* ids, bool ids64, int64_t n, int64_t V, int64_t* slots, int64_t tag, cudaStream_t s) {
  if (n > 0) record_bad_id_k<<<1, kThreads, 0, s>>>(ids, ids64, n, V, slots, tag);
}

void adamw_multi(const AdamWMultiBatch& b, const AdamWScalars& hp, const double* clip, cudaStream_t s) {
  if (b.count == 0) return;
  const dim3 grid = multi_grid(b.n, b.count);
  using bf = __nv_bfloat16;
  if (b.m_bf16 && b.v_bf16)
    adamw_multi_k<bf, bf><<<grid, kThreads, 0, s>>>(b, hp, clip);
  else if (b.m_bf16)
    adamw_multi_k<bf, float><<<grid, kThreads, 0, s>>>(b, hp, clip);
  else if (b.v_bf16)
    adamw_multi_k<float, bf><<<grid, kThreads, 0, s>>>(b, hp, clip);
  else
    adamw_multi_k<float, float><<<grid, kThreads, 0, s>>>(b, hp, clip);
}

void sgd_multi(const AdamWMultiBatch& b, float lr, float momentum, const double* clip, float grad_scale,
               cudaStream_t s) {
  if (b.count == 0) return;
  const dim3 grid = multi_grid(b.n, b.count);
  sgd_multi_k<<<grid, kThreads, 0, s>>>(b, lr, momentum, clip, grad_scale);
}

}  // namespace moecore::launch
