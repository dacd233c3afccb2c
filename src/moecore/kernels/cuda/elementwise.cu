// Elementwise and row-wise kernels: fill/add/scale, deterministic sums, RMSNorm, RoPE,
// activations, the embedding forward (its backward: embedding_bwd.cu), multi-tensor AdamW, SGD, zero counts
// (see launch.h).
// Straightforward one-pass kernels; the math follows the CPU kernels in kernels/cpu line by line.
#include "moecore/kernels/cuda/common.cuh"
#include "moecore/kernels/cuda/launch.h"
#include "moecore/kernels/cuda/launch_col_reduce.h"

namespace moecore::launch {

namespace {
__global__ void fill_k(float* p, float v, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    p[i] = v;
}
__global__ void add_k(const float* a, const float* b, float* o, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    o[i] = a[i] + b[i];
}
__global__ void scale_k(float* a, float v, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    a[i] *= v;
}

// Stage 1: each of kReduceBlocks blocks sums a fixed strided subset; stage 2: one block sums the partials.
constexpr int kReduceBlocks = 256;
__global__ void reduce_partial_k(int kind, const float* a, const float* b, int64_t n, double* partial) {
  __shared__ double sm[kThreads];
  double acc = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const double x = a[i];
    acc += kind == 0 ? x * x : (kind == 1 ? x : x * static_cast<double>(b[i]));
  }
  const double r = block_sum(acc, sm);
  if (threadIdx.x == 0) partial[blockIdx.x] = r;
}
__global__ void reduce_final_k(const double* partial, double* out) {
  __shared__ double sm[kThreads];
  const double r = block_sum(threadIdx.x < kReduceBlocks ? partial[threadIdx.x] : 0.0, sm);
  if (threadIdx.x == 0) *out = r;
}

__global__ void rmsnorm_fwd_k(const float* x, const float* w, float* y, float* rstd, int64_t H, float eps) {
  __shared__ float sm[kThreads];
  const int64_t t = blockIdx.x;
  const float* xr = x + t * H;
  float ss = 0;
  for (int64_t j = threadIdx.x; j < H; j += blockDim.x) ss += xr[j] * xr[j];
  ss = block_sum(ss, sm);
  float r = 1.0f / sqrtf(ss / float(H) + eps);
  if (!isfinite(ss)) {  // the squares overflowed: normalise by the largest magnitude first (as the CPU kernel)
    float m = 0;
    for (int64_t j = threadIdx.x; j < H; j += blockDim.x) m = fmaxf(m, fabsf(xr[j]));
    m = block_max(m, sm);
    float sm2 = 0;
    for (int64_t j = threadIdx.x; j < H; j += blockDim.x) sm2 += (xr[j] / m) * (xr[j] / m);
    sm2 = block_sum(sm2, sm);
    r = 1.0f / (m * sqrtf(sm2 / float(H) + eps / (m * m)));
  }
  if (threadIdx.x == 0) rstd[t] = r;
  for (int64_t j = threadIdx.x; j < H; j += blockDim.x) y[t * H + j] = xr[j] * r * w[j];
}

__global__ void rmsnorm_bwd_dx_k(const float* dy, const float* x, const float* w, const float* rstd, float* dx,
                                 int64_t H) {
  __shared__ float sm[kThreads];
  const int64_t t = blockIdx.x;
  const float r = rstd[t];
  float c = 0;
  for (int64_t j = threadIdx.x; j < H; j += blockDim.x) c += w[j] * dy[t * H + j] * x[t * H + j];
  c = block_sum(c, sm);
  const float k = r * r * c / float(H);
  for (int64_t j = threadIdx.x; j < H; j += blockDim.x) dx[t * H + j] = r * (w[j] * dy[t * H + j] - x[t * H + j] * k);
}

// The same two kernels with a warp per row (H ≤ kWarpRowMaxH): lanes stride over the row, warp_sum in place of the
// block tree.
__global__ void rmsnorm_fwd_warp_k(const float* x, const float* w, float* y, float* rstd, int64_t rows, int64_t H,
                                   float eps) {
  const int64_t t = blockIdx.x * int64_t(kRowsPerBlock) + threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  if (t >= rows) return;  // the whole warp: t is uniform across it
  const float* xr = x + t * H;
  float ss = 0;
  for (int64_t j = lane; j < H; j += 32) ss += xr[j] * xr[j];
  ss = warp_sum(ss);
  float r = 1.0f / sqrtf(ss / float(H) + eps);
  if (!isfinite(ss)) {  // as rmsnorm_fwd_k: normalise by the largest magnitude first
    float m = 0;
    for (int64_t j = lane; j < H; j += 32) m = fmaxf(m, fabsf(xr[j]));
    m = warp_max(m);
    float sm2 = 0;
    for (int64_t j = lane; j < H; j += 32) sm2 += (xr[j] / m) * (xr[j] / m);
    sm2 = warp_sum(sm2);
    r = 1.0f / (m * sqrtf(sm2 / float(H) + eps / (m * m)));
  }
  if (lane == 0) rstd[t] = r;
  for (int64_t j = lane; j < H; j += 32) y[t * H + j] = xr[j] * r * w[j];
}

__global__ void rmsnorm_bwd_dx_warp_k(const float* dy, const float* x, const float* w, const float* rstd, float* dx,
                                      int64_t rows, int64_t H) {
  const int64_t t = blockIdx.x * int64_t(kRowsPerBlock) + threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  if (t >= rows) return;
  const float r = rstd[t];
  float c = 0;
  for (int64_t j = lane; j < H; j += 32) c += w[j] * dy[t * H + j] * x[t * H + j];
  c = warp_sum(c);
  const float k = r * r * c / float(H);
  for (int64_t j = lane; j < H; j += 32) dx[t * H + j] = r * (w[j] * dy[t * H + j] - x[t * H + j] * k);
}

// One thread per rotated pair (a_i, b_i) of a row: it reads both before writing both, so the rotation may run in
// place (the layers rotate q and k in place) without a scratch copy. Channels outside [offset, offset + rot_dim)
// are copied by the launcher when y is not x.
__global__ void rope_pairs_k(const float* x, const float* cs, const float* sn, float* y, int64_t S, int64_t BN,
                             int64_t D, int64_t offset, int64_t rot_dim, bool interleaved, float sign) {
  const int64_t h = rot_dim / 2, n = S * BN * h;
  // Pair i is channels a_i = offset + i·a_step and b_i = a_i + b_off.
  const int64_t a_step = interleaved ? 2 : 1, b_off = interleaved ? 1 : h;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < n; idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = idx / h, i = idx % h, s = row / BN;
    const int64_t ia = row * D + offset + i * a_step, ib = ia + b_off;
    const float a = x[ia], b = x[ib], ci = cs[s * h + i], si = sign * sn[s * h + i];
    y[ia] = a * ci - b * si;
    y[ib] = b * ci + a * si;
  }
}

__device__ __forceinline__ float sigmoidf_(float a) {
  return 1.0f / (1.0f + expf(-a));
}
__device__ __forceinline__ void act_and_grad(int act, float x, float& f, float& df) {
  if (act == 1) {
    const float cdf = 0.5f * (1.0f + erff(x * 0.70710678118654752f));
    const float pdf = expf(-0.5f * x * x) * 0.3989422804014327f;
    f = x * cdf;
    df = cdf + x * pdf;
  } else {
    const float r = x > 0.0f ? x : 0.0f;
    f = r * r;
    df = 2.0f * r;
  }
}
__device__ __forceinline__ void store(void* p, bool bf, int64_t i, float v) {
  if (bf)
    static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
  else
    static_cast<float*>(p)[i] = v;
}

// An f32 or bf16 element read as f32: the fc1 output and the activation's output gradient arrive in either dtype
// (bf16 where the GEMM that wrote them rounded them), and are widened here rather than by a separate cast pass.
__device__ __forceinline__ float load(const void* p, bool bf, int64_t i) {
  return bf ? __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]) : static_cast<const float*>(p)[i];
}

__global__ void act_fwd_k(int act, const void* x, bool xb, const float* p, void* y, bool bf, int64_t rows, int64_t F) {
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < rows * F;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = idx / F, j = idx % F;
    const float scale = p ? p[t] : 1.0f;
    if (act == 0) {
      const float a = load(x, xb, t * 2 * F + j), b = load(x, xb, t * 2 * F + F + j);
      store(y, bf, idx, a * sigmoidf_(a) * b * scale);
    } else {
      float f, df;
      act_and_grad(act, load(x, xb, idx), f, df);
      store(y, bf, idx, f * scale);
    }
  }
}

// One block per row: dx elementwise, dprobs as the row's fixed-order block sum.
__global__ void act_bwd_k(int act, const void* dy, bool dyb, const void* x, bool xb, const float* p, void* dx, bool bf,
                          float* dp, int64_t F) {
  __shared__ float sm[kThreads];
  const int64_t t = blockIdx.x;
  const float scale = p ? p[t] : 1.0f;
  float dps = 0;
  for (int64_t j = threadIdx.x; j < F; j += blockDim.x) {
    const float g0 = load(dy, dyb, t * F + j);
    if (act == 0) {
      const float a = load(x, xb, t * 2 * F + j), b = load(x, xb, t * 2 * F + F + j), s = sigmoidf_(a), silu = a * s,
                  g = g0 * scale;
      store(dx, bf, t * 2 * F + j, g * b * s * (1.0f + a * (1.0f - s)));
      store(dx, bf, t * 2 * F + F + j, g * silu);
      dps += g0 * silu * b;
    } else {
      float f, df;
      act_and_grad(act, load(x, xb, t * F + j), f, df);
      store(dx, bf, t * F + j, g0 * scale * df);
      dps += g0 * f;
    }
  }
  if (dp) {
    dps = block_sum(dps, sm);
    if (threadIdx.x == 0) dp[t] = dps;
  }
}

__global__ void embedding_fwd_k(const void* ids, bool ids64, const char* w, char* y, int64_t T, int64_t row_bytes,
                                int64_t VL, int64_t vocab_start) {
  const int64_t t = blockIdx.x;
  const int64_t r = id_at(ids, ids64, t) - vocab_start;
  for (int64_t b = threadIdx.x; b < row_bytes; b += blockDim.x)
    y[t * row_bytes + b] = r >= 0 && r < VL ? w[r * row_bytes + b] : 0;
}

// Moments in f32, or bf16 (M = __nv_bfloat16: the precision-aware optimizer's states, read to f32, updated in f32,
// the parameter update computed from the f32 values, rounded to nearest even on store, as the CPU kernel does).
template <typename M>
__device__ __forceinline__ void store_moment(M* p, float x) {
  if constexpr (sizeof(M) == 2)
    *p = __float2bfloat16_rn(x);
  else
    *p = x;
}
template <typename M, typename V>
__global__ void adamw_k(AdamWBatch b, AdamWScalars hp) {
  const int k = blockIdx.y;
  float* p = b.p[k];
  const float* g = b.g[k];
  M* m = static_cast<M*>(b.m[k]);
  V* v = static_cast<V*>(b.v[k]);
  __nv_bfloat16* pb = static_cast<__nv_bfloat16*>(b.p_bf16[k]);
  const int64_t n = b.n[k];
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float gi = g[i] * hp.grad_scale;
    const float mi = hp.beta1 * to_f32(m[i]) + (1.0f - hp.beta1) * gi;
    const float vi = hp.beta2 * to_f32(v[i]) + (1.0f - hp.beta2) * gi * gi;
    store_moment(m + i, mi);
    store_moment(v + i, vi);
    const float mhat = mi / hp.bc1, vhat = vi / hp.bc2;
    const float pi = p[i] * (1.0f - hp.lr * hp.wd) - hp.lr * mhat / (sqrtf(vhat) + hp.eps);
    p[i] = pi;
    if (pb) pb[i] = __float2bfloat16_rn(pi);
  }
}

// SGD with momentum, every product and sum rounded on its own (__fmul_rn / __fadd_rn are never contracted into a
// fused multiply-add), as the CPU's loop computes them: the same bits.
__global__ void sgd_k(float* p, const float* g, float* buf, int64_t n, float lr, float wd, float mom, float gs) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float d = __fadd_rn(__fmul_rn(g[i], gs), __fmul_rn(wd, p[i]));
    const float bi = __fadd_rn(__fmul_rn(mom, buf[i]), d);
    buf[i] = bi;
    p[i] = __fsub_rn(p[i], __fmul_rn(lr, bi));
  }
}

// Entries equal to 0 (−0 too; NaN is not): per-block counts, then one block sums them. Integer sums: exact.
__global__ void count_zeros_partial_k(const float* a, int64_t n, int64_t* partial) {
  __shared__ int64_t sm[kThreads];
  int64_t c = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    c += a[i] == 0.0f;
  sm[threadIdx.x] = c;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) sm[threadIdx.x] += sm[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) partial[blockIdx.x] = sm[0];
}
__global__ void count_zeros_final_k(const int64_t* partial, int blocks, int64_t* out) {
  if (threadIdx.x != 0) return;
  int64_t c = 0;
  for (int b = 0; b < blocks; b++) c += partial[b];
  *out = c;
}
}  // namespace

void fill(float* p, float v, int64_t n, cudaStream_t s) {
  if (n > 0) fill_k<<<grid_for(n), kThreads, 0, s>>>(p, v, n);
}
void add(const float* a, const float* b, float* out, int64_t n, cudaStream_t s) {
  if (n > 0) add_k<<<grid_for(n), kThreads, 0, s>>>(a, b, out, n);
}
void scale(float* a, float v, int64_t n, cudaStream_t s) {
  if (n > 0) scale_k<<<grid_for(n), kThreads, 0, s>>>(a, v, n);
}
void reduce_sum(int kind, const float* a, const float* b, int64_t n, double* out, cudaStream_t s) {
  double* partial = nullptr;
  cudaMallocAsync(&partial, kReduceBlocks * sizeof(double), s);
  reduce_partial_k<<<kReduceBlocks, kThreads, 0, s>>>(kind, a, b, n, partial);
  reduce_final_k<<<1, kThreads, 0, s>>>(partial, out);
  cudaFreeAsync(partial, s);
}

void rmsnorm_forward(const float* x, const float* w, float* y, float* rstd, int64_t rows, int64_t H, float eps,
                     cudaStream_t s) {
  if (rows == 0) return;
  if (H <= kWarpRowMaxH)
    rmsnorm_fwd_warp_k<<<warp_row_grid(rows), kThreads, 0, s>>>(x, w, y, rstd, rows, H, eps);
  else
    rmsnorm_fwd_k<<<static_cast<unsigned>(rows), kThreads, 0, s>>>(x, w, y, rstd, H, eps);
}
void rmsnorm_backward(const float* dy, const float* x, const float* w, const float* rstd, float* dx, float* dw,
                      float* scratch, int64_t rows, int64_t H, cudaStream_t s) {
  if (rows == 0) return;
  if (H <= kWarpRowMaxH)
    rmsnorm_bwd_dx_warp_k<<<warp_row_grid(rows), kThreads, 0, s>>>(dy, x, w, rstd, dx, rows, H);
  else
    rmsnorm_bwd_dx_k<<<static_cast<unsigned>(rows), kThreads, 0, s>>>(dy, x, w, rstd, dx, H);
  rmsnorm_dw_two_stage(dy, x, rstd, dw, scratch, rows, H, s);
}

void rope(const float* x, const float* cos_SR, const float* sin_SR, float* y, int64_t S, int64_t BN, int64_t D,
          int64_t offset, int64_t rot_dim, bool interleaved, float sign, cudaStream_t s) {
  const int64_t n = S * BN * D, pairs = S * BN * (rot_dim / 2);
  if (n == 0) return;
  // Out of place, the channels the rotation does not touch come over first (an error is left for the caller's
  // launch check, which reads the last error).
  if (x != y && rot_dim < D) cudaMemcpyAsync(y, x, n * sizeof(float), cudaMemcpyDeviceToDevice, s);
  if (pairs > 0)
    rope_pairs_k<<<grid_for(pairs), kThreads, 0, s>>>(x, cos_SR, sin_SR, y, S, BN, D, offset, rot_dim, interleaved,
                                                      sign);
}

void activation_forward(int act, const void* x, bool x_bf16, const float* probs, void* y, bool y_bf16, int64_t rows,
                        int64_t F, cudaStream_t s) {
  if (rows * F > 0) act_fwd_k<<<grid_for(rows * F), kThreads, 0, s>>>(act, x, x_bf16, probs, y, y_bf16, rows, F);
}
void activation_backward(int act, const void* dy, bool dy_bf16, const void* x, bool x_bf16, const float* probs,
                         void* dx, bool dx_bf16, float* dprobs, int64_t rows, int64_t F, cudaStream_t s) {
  if (rows > 0)
    act_bwd_k<<<static_cast<unsigned>(rows), kThreads, 0, s>>>(act, dy, dy_bf16, x, x_bf16, probs, dx, dx_bf16, dprobs,
                                                               F);
}

void embedding_forward(const void* ids, bool ids64, const void* w, void* y, int64_t T, int64_t H, int64_t VL,
                       int64_t vocab_start, int elem_bytes, cudaStream_t s) {
  if (T > 0)
    embedding_fwd_k<<<static_cast<unsigned>(T), kThreads, 0, s>>>(
        ids, ids64, static_cast<const char*>(w), static_cast<char*>(y), T, H * elem_bytes, VL, vocab_start);
}
void adamw(const AdamWBatch& batch, const AdamWScalars& hp, cudaStream_t s) {
  if (batch.count == 0) return;
  int64_t most = 1;
  for (int i = 0; i < batch.count; i++) most = batch.n[i] > most ? batch.n[i] : most;
  const dim3 grid(grid_for(most, kThreads, 1024), static_cast<unsigned>(batch.count));
  using bf = __nv_bfloat16;
  if (batch.m_bf16 && batch.v_bf16)
    adamw_k<bf, bf><<<grid, kThreads, 0, s>>>(batch, hp);
  else if (batch.m_bf16)
    adamw_k<bf, float><<<grid, kThreads, 0, s>>>(batch, hp);
  else if (batch.v_bf16)
    adamw_k<float, bf><<<grid, kThreads, 0, s>>>(batch, hp);
  else
    adamw_k<float, float><<<grid, kThreads, 0, s>>>(batch, hp);
}

void sgd(float* p, const float* g, float* buf, int64_t n, float lr, float wd, float momentum, float grad_scale,
         cudaStream_t s) {
  if (n > 0) sgd_k<<<grid_for(n), kThreads, 0, s>>>(p, g, buf, n, lr, wd, momentum, grad_scale);
}

void count_zeros(const float* a, int64_t n, int64_t* out, cudaStream_t s) {
  const int blocks = static_cast<int>(grid_for(n, kThreads, kReduceBlocks));
  int64_t* partial = nullptr;
  cudaMallocAsync(&partial, blocks * sizeof(int64_t), s);
  count_zeros_partial_k<<<blocks, kThreads, 0, s>>>(a, n, partial);
  count_zeros_final_k<<<1, 32, 0, s>>>(partial, blocks, out);
  cudaFreeAsync(partial, s);
}

}  // namespace moecore::launch
