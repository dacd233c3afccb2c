// LayerNorm forward/backward and the bias kernels of the linear layers and the experts (see launch.h). The math follows
// kernels/cpu/layernorm.cpp and elementwise.cpp: two-pass statistics and the overflow-safe path; the weight and bias
// gradients are the two-stage column reductions of col_reduce.cu (fixed order, no atomics).
#include "moecore/kernels/cuda/common.cuh"
#include "moecore/kernels/cuda/launch.h"
#include "moecore/kernels/cuda/launch_col_reduce.h"

namespace moecore::launch {

namespace {
__global__ void layernorm_fwd_k(const float* x, const float* w, const float* b, float* y, float* mean, float* rstd,
                                int64_t H, float eps) {
  __shared__ float sm[kThreads];
  const int64_t t = blockIdx.x;
  const float* xr = x + t * H;
  float s = 0;
  for (int64_t j = threadIdx.x; j < H; j += blockDim.x) s += xr[j];
  float mu = block_sum(s, sm) / float(H);
  float ss = 0;
  for (int64_t j = threadIdx.x; j < H; j += blockDim.x) ss += (xr[j] - mu) * (xr[j] - mu);
  ss = block_sum(ss, sm);
  float r = 1.0f / sqrtf(ss / float(H) + eps);
  float div = 1.0f, shift = mu, rs = r;   // y = (x/div − shift)·rs·w + b (x/1 is exact)
  if (!(isfinite(mu) && isfinite(ss))) {  // overflow: statistics of the row scaled by its largest magnitude
    float m = 0;
    for (int64_t j = threadIdx.x; j < H; j += blockDim.x) m = fmaxf(m, fabsf(xr[j]));
    m = block_max(m, sm);
    float sm1 = 0;
    for (int64_t j = threadIdx.x; j < H; j += blockDim.x) sm1 += xr[j] / m;
    const float mu_m = block_sum(sm1, sm) / float(H);
    float ss_m = 0;
    for (int64_t j = threadIdx.x; j < H; j += blockDim.x) ss_m += (xr[j] / m - mu_m) * (xr[j] / m - mu_m);
    ss_m = block_sum(ss_m, sm);
    const float r_m = 1.0f / sqrtf(ss_m / float(H) + eps / (m * m));
    div = m, shift = mu_m, rs = r_m;
    mu = mu_m * m, r = r_m / m;
  }
  for (int64_t j = threadIdx.x; j < H; j += blockDim.x) y[t * H + j] = (xr[j] / div - shift) * rs * w[j] + b[j];
  if (threadIdx.x == 0) mean[t] = mu, rstd[t] = r;
}

__global__ void layernorm_bwd_dx_k(const float* dy, const float* x, const float* w, const float* mean,
                                   const float* rstd, float* dx, int64_t H) {
  __shared__ float sm[kThreads];
  const int64_t t = blockIdx.x;
  const float mu = mean[t], r = rstd[t];
  float sg = 0, sgx = 0;
  for (int64_t j = threadIdx.x; j < H; j += blockDim.x) {
    const float g = w[j] * dy[t * H + j];
    sg += g;
    sgx += g * (x[t * H + j] - mu) * r;
  }
  const float mg = block_sum(sg, sm) / float(H), mgx = block_sum(sgx, sm) / float(H);
  for (int64_t j = threadIdx.x; j < H; j += blockDim.x)
    dx[t * H + j] = r * (w[j] * dy[t * H + j] - mg - (x[t * H + j] - mu) * r * mgx);
}

// The same two kernels with a warp per row (H ≤ kWarpRowMaxH, common.cuh).
__global__ void layernorm_fwd_warp_k(const float* x, const float* w, const float* b, float* y, float* mean, float* rstd,
                                     int64_t rows, int64_t H, float eps) {
  const int64_t t = blockIdx.x * int64_t(kRowsPerBlock) + threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  if (t >= rows) return;  // the whole warp: t is uniform across it
  const float* xr = x + t * H;
  float s = 0;
  for (int64_t j = lane; j < H; j += 32) s += xr[j];
  float mu = warp_sum(s) / float(H);
  float ss = 0;
  for (int64_t j = lane; j < H; j += 32) ss += (xr[j] - mu) * (xr[j] - mu);
  ss = warp_sum(ss);
  float r = 1.0f / sqrtf(ss / float(H) + eps);
  float div = 1.0f, shift = mu, rs = r;
  if (!(isfinite(mu) && isfinite(ss))) {  // as layernorm_fwd_k
    float m = 0;
    for (int64_t j = lane; j < H; j += 32) m = fmaxf(m, fabsf(xr[j]));
    m = warp_max(m);
    float sm1 = 0;
    for (int64_t j = lane; j < H; j += 32) sm1 += xr[j] / m;
    const float mu_m = warp_sum(sm1) / float(H);
    float ss_m = 0;
    for (int64_t j = lane; j < H; j += 32) ss_m += (xr[j] / m - mu_m) * (xr[j] / m - mu_m);
    ss_m = warp_sum(ss_m);
    const float r_m = 1.0f / sqrtf(ss_m / float(H) + eps / (m * m));
    div = m, shift = mu_m, rs = r_m;
    mu = mu_m * m, r = r_m / m;
  }
  for (int64_t j = lane; j < H; j += 32) y[t * H + j] = (xr[j] / div - shift) * rs * w[j] + b[j];
  if (lane == 0) mean[t] = mu, rstd[t] = r;
}

__global__ void layernorm_bwd_dx_warp_k(const float* dy, const float* x, const float* w, const float* mean,
                                        const float* rstd, float* dx, int64_t rows, int64_t H) {
  const int64_t t = blockIdx.x * int64_t(kRowsPerBlock) + threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  if (t >= rows) return;
  const float mu = mean[t], r = rstd[t];
  float sg = 0, sgx = 0;
  for (int64_t j = lane; j < H; j += 32) {
    const float g = w[j] * dy[t * H + j];
    sg += g;
    sgx += g * (x[t * H + j] - mu) * r;
  }
  const float mg = warp_sum(sg) / float(H), mgx = warp_sum(sgx) / float(H);
  for (int64_t j = lane; j < H; j += 32)
    dx[t * H + j] = r * (w[j] * dy[t * H + j] - mg - (x[t * H + j] - mu) * r * mgx);
}

// y[t, j] += b[j]·w[t] (w null: b[j], the same bits: b·1 is b).
// y[t, j] += b[j]·w[t] (b[j] without w), computed in f32; a bf16 y (an expert GEMM's bf16 output) is widened, added
// to and rounded again as it is stored, as the CPU's bias_rows does.
template <typename Y>
__global__ void add_row_bias_k(Y* y, const float* b, const float* w, int64_t rows, int64_t N) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < rows * N; i += int64_t(gridDim.x) * blockDim.x)
    store_f32(y + i, to_f32(y[i]) + (w ? b[i % N] * w[i / N] : b[i % N]));
}

// dw[t] += Σ_j dy[t, j]·b[j]: a warp per row, each lane a fixed stride of columns, then the warp's butterfly sum.
template <typename G>
__global__ void add_row_dots_k(const G* dy, const float* b, float* dw, int64_t rows, int64_t N) {
  const int lane = threadIdx.x & 31;
  const int64_t t = blockIdx.x * int64_t(kRowsPerBlock) + (threadIdx.x >> 5);
  if (t >= rows) return;
  float s = 0.0f;
  for (int64_t j = lane; j < N; j += 32) s += to_f32(dy[t * N + j]) * b[j];
  s = warp_sum(s);
  if (lane == 0) dw[t] += s;
}

}  // namespace

void layernorm_forward(const float* x, const float* w, const float* b, float* y, float* mean, float* rstd, int64_t rows,
                       int64_t H, float eps, cudaStream_t s) {
  if (rows == 0) return;
  if (H <= kWarpRowMaxH)
    layernorm_fwd_warp_k<<<warp_row_grid(rows), kThreads, 0, s>>>(x, w, b, y, mean, rstd, rows, H, eps);
  else
    layernorm_fwd_k<<<static_cast<unsigned>(rows), kThreads, 0, s>>>(x, w, b, y, mean, rstd, H, eps);
}
void layernorm_backward(const float* dy, const float* x, const float* w, const float* mean, const float* rstd,
                        float* dx, float* dw, float* db, float* scratch, int64_t rows, int64_t H, cudaStream_t s) {
  if (rows == 0) return;
  if (H <= kWarpRowMaxH)
    layernorm_bwd_dx_warp_k<<<warp_row_grid(rows), kThreads, 0, s>>>(dy, x, w, mean, rstd, dx, rows, H);
  else
    layernorm_bwd_dx_k<<<static_cast<unsigned>(rows), kThreads, 0, s>>>(dy, x, w, mean, rstd, dx, H);
  layernorm_dwb_two_stage(dy, x, mean, rstd, dw, db, scratch, rows, H, s);
}
void add_row_bias(void* y, bool y_bf16, const float* b, const float* w, int64_t rows, int64_t N, cudaStream_t s) {
  if (rows * N <= 0) return;
  if (y_bf16)
    add_row_bias_k<<<grid_for(rows * N), kThreads, 0, s>>>(static_cast<__nv_bfloat16*>(y), b, w, rows, N);
  else
    add_row_bias_k<<<grid_for(rows * N), kThreads, 0, s>>>(static_cast<float*>(y), b, w, rows, N);
}
void accumulate_col_sums(const void* dy, bool dy_bf16, const float* w, float* db, float* scratch, int64_t rows,
                         int64_t N, cudaStream_t s) {
  weighted_col_sums_two_stage(dy, dy_bf16, w, db, scratch, rows, N, s);
}
void add_row_dots(const void* dy, bool dy_bf16, const float* b, float* dw, int64_t rows, int64_t N, cudaStream_t s) {
  if (rows <= 0) return;
  if (dy_bf16)
    add_row_dots_k<<<warp_row_grid(rows), kThreads, 0, s>>>(static_cast<const __nv_bfloat16*>(dy), b, dw, rows, N);
  else
    add_row_dots_k<<<warp_row_grid(rows), kThreads, 0, s>>>(static_cast<const float*>(dy), b, dw, rows, N);
}

}  // namespace moecore::launch
