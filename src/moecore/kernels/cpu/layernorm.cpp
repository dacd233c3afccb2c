// LayerNorm forward/backward (see layernorm.h). Statistics in f64 for f64 tensors, f32 otherwise, two passes (mean,
// then the mean of squared deviations) so no cancellation; a row whose squared deviations overflow is normalized
// by its largest magnitude first, so no finite input gives inf or NaN.
//
// Gradient, per row with x̂_k = (x_k − μ)·r, g_k = w_k·dy_k, H the row length:
//   y_k = x̂_k·w_k + b_k,   ∂x̂_k/∂x_j = r·(δ_kj − 1/H − x̂_k·x̂_j/H)
//   dx_j = Σ_k g_k·∂x̂_k/∂x_j = r·(g_j − mean(g) − x̂_j·mean(g·x̂))
//   dw_k += Σ_rows dy_k·x̂_k,   db_k += Σ_rows dy_k

#include <algorithm>
#include <cmath>

#include "moecore/core/cpu.h"
#include "moecore/kernels/backends.h"
#include "moecore/kernels/cpu/kernels.h"
#include "moecore/kernels/cpu/vec_math.h"

namespace moecore::kernels::cpu {

namespace {
// Row by row: x += res first when res is given (written back), then the normalised row stored as Y. Row sums run in
// vector lanes (omp simd reduction), as in rmsnorm.cpp.
template <typename T, typename Y>
MOE_ALWAYS_INLINE void fwd_body(T* x, const T* res, const T* w, const T* b, Y* y, T* mean, T* rstd, int64_t rows,
                                int64_t H, double eps) {
#pragma omp for schedule(static)
  for (int64_t t = 0; t < rows; t++) {
    T* xr = x + t * H;
    if (res)
      for (int64_t j = 0; j < H; j++) xr[j] = xr[j] + res[t * H + j];
    Y* yr = y + t * H;
    T sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < H; j++) sum += xr[j];
    T mu = sum / T(H);
    T ss = 0;
#pragma omp simd reduction(+ : ss)
    for (int64_t j = 0; j < H; j++) ss += (xr[j] - mu) * (xr[j] - mu);
    T r = T(1) / std::sqrt(ss / T(H) + T(eps));
    if (std::isfinite(mu) && std::isfinite(ss)) {
      for (int64_t j = 0; j < H; j++) store_as(yr + j, (xr[j] - mu) * r * w[j] + b[j]);
    } else {
      // The sum or the squares overflowed (|x| beyond ~1e19 in f32): the same statistics with the row scaled by
      // its largest magnitude m, x̂ = (x/m − μ/m) / sqrt(var/m² + eps/m²), so any finite row normalizes to finite
      // values. mean and rstd keep their scaled meaning (μ = m·μ_m, r = r_m/m) for backward.
      T m = 0;
      for (int64_t j = 0; j < H; j++) m = std::max(m, std::fabs(xr[j]));
      T sum_m = 0;
      for (int64_t j = 0; j < H; j++) sum_m += xr[j] / m;
      const T mu_m = sum_m / T(H);
      T ss_m = 0;
      for (int64_t j = 0; j < H; j++) ss_m += (xr[j] / m - mu_m) * (xr[j] / m - mu_m);
      const T r_m = T(1) / std::sqrt(ss_m / T(H) + T(eps) / (m * m));
      for (int64_t j = 0; j < H; j++) store_as(yr + j, (xr[j] / m - mu_m) * r_m * w[j] + b[j]);
      mu = mu_m * m;
      r = r_m / m;
    }
    mean[t] = mu;
    rstd[t] = r;
  }
}
template <typename T, typename Y>
void fwd(T* x, const T* res, const T* w, const T* b, Y* y, T* mean, T* rstd, int64_t rows, int64_t H, double eps) {
#pragma omp parallel
  MOE_CPU_CLONES(fwd_body<T, Y>(x, res, w, b, y, mean, rstd, rows, H, eps));
}

// X: T, or bf16 (an input kept rounded for backward, widened as it is read).
template <typename T, typename X>
MOE_ALWAYS_INLINE void bwd_body(const T* dy, const X* x, const T* w, const T* mean, const T* rstd, T* dx, const T* dres,
                                T* dw, T* db, int64_t rows, int64_t H) {
#pragma omp for schedule(static)
  for (int64_t t = 0; t < rows; t++) {
    const X* xr = x + t * H;
    const T* dyr = dy + t * H;
    const T mu = mean[t], r = rstd[t];
    T sg = 0, sgx = 0;  // Σ g, Σ g·x̂
#pragma omp simd reduction(+ : sg, sgx)
    for (int64_t j = 0; j < H; j++) {
      const T g = w[j] * dyr[j];
      sg += g;
      sgx += g * (load_as<T>(xr + j) - mu) * r;
    }
    const T mg = sg / T(H), mgx = sgx / T(H);
    T* dxr = dx + t * H;
    for (int64_t j = 0; j < H; j++) dxr[j] = r * (w[j] * dyr[j] - mg - (load_as<T>(xr + j) - mu) * r * mgx);
    // The residual's gradient in a loop of its own (see rmsnorm.cpp: no FMA contraction, the bits of add_).
    if (dres)
      for (int64_t j = 0; j < H; j++) dxr[j] = dxr[j] + dres[t * H + j];
  }
  // dw, db: each thread owns a column range and walks rows in order, so the sum order is fixed.
  constexpr int64_t kCols = 64;
  const int64_t nblk = (H + kCols - 1) / kCols;
#pragma omp for schedule(static)
  for (int64_t blk = 0; blk < nblk; blk++) {
    const int64_t j0 = blk * kCols, j1 = std::min(H, j0 + kCols);
    T acc_w[kCols] = {}, acc_b[kCols] = {};
    for (int64_t t = 0; t < rows; t++) {
      const T mu = mean[t], r = rstd[t];
      for (int64_t j = j0; j < j1; j++) {
        acc_w[j - j0] += dy[t * H + j] * (load_as<T>(x + t * H + j) - mu) * r;
        acc_b[j - j0] += dy[t * H + j];
      }
    }
    for (int64_t j = j0; j < j1; j++) {
      dw[j] += acc_w[j - j0];
      db[j] += acc_b[j - j0];
    }
  }
}
template <typename T, typename X>
void bwd(const T* dy, const X* x, const T* w, const T* mean, const T* rstd, T* dx, const T* dres, T* dw, T* db,
         int64_t rows, int64_t H) {
#pragma omp parallel
  MOE_CPU_CLONES(bwd_body<T, X>(dy, x, w, mean, rstd, dx, dres, dw, db, rows, H));
}
}  // namespace

namespace {
void forward_impl(Tensor& x_TH, const Tensor* res_TH, const Tensor& w_H, const Tensor& b_H, double eps, Tensor& y_TH,
                  Tensor& mean_T, Tensor& rstd_T) {
  const int64_t H = x_TH.cols(), rows = x_TH.rows();
  MOE_ASSERT_SHAPE(w_H, {H});
  MOE_ASSERT_SHAPE(b_H, {H});
  MOE_ASSERT(y_TH.shape() == x_TH.shape() && mean_T.numel() == rows && rstd_T.numel() == rows);
  MOE_ASSERT(!res_TH || (res_TH->numel() == x_TH.numel() && res_TH->dtype() == x_TH.dtype()));
  MOE_ASSERT(y_TH.dtype() == x_TH.dtype() || (is_half(y_TH.dtype()) && x_TH.dtype() == DType::F32));
  MOE_DISPATCH_FLOAT(x_TH.dtype(), T, {
    const T* res = res_TH ? res_TH->data<T>() : nullptr;
    with_storage<T>(y_TH.dtype(), [&](auto* yt) {
      using Y = storage_t<decltype(yt)>;
      fwd<T, Y>(x_TH.data<T>(), res, w_H.data<T>(), b_H.data<T>(), y_TH.data<Y>(), mean_T.data<T>(), rstd_T.data<T>(),
                rows, H, eps);
    });
  });
}
}  // namespace

void layernorm_forward(const Tensor& x_TH, const Tensor& w_H, const Tensor& b_H, double eps, Tensor& y_TH,
                       Tensor& mean_T, Tensor& rstd_T) {
  Tensor x = x_TH;  // not written: no residual
  forward_impl(x, nullptr, w_H, b_H, eps, y_TH, mean_T, rstd_T);
}

void layernorm_forward_add(Tensor& x_TH, const Tensor& res_TH, const Tensor& w_H, const Tensor& b_H, double eps,
                           Tensor& y_TH, Tensor& mean_T, Tensor& rstd_T) {
  forward_impl(x_TH, &res_TH, w_H, b_H, eps, y_TH, mean_T, rstd_T);
}

void layernorm_backward(const Tensor& dy_TH, const Tensor& x_TH, const Tensor& w_H, const Tensor& mean_T,
                        const Tensor& rstd_T, Tensor& dx_TH, Tensor& dw_H, Tensor& db_H, const Tensor* dres_TH) {
  MOE_ASSERT(!dres_TH || (dres_TH->numel() == x_TH.numel() && dres_TH->dtype() == dx_TH.dtype()));
  const int64_t H = x_TH.cols(), rows = x_TH.rows();
  MOE_ASSERT(dy_TH.shape() == x_TH.shape() && dx_TH.shape() == x_TH.shape());
  MOE_ASSERT(dy_TH.dtype() == dx_TH.dtype() && (x_TH.dtype() == dx_TH.dtype() || is_half(x_TH.dtype())));
  MOE_ASSERT_SHAPE(w_H, {H});
  MOE_ASSERT_SHAPE(dw_H, {H});
  MOE_ASSERT_SHAPE(db_H, {H});
  MOE_ASSERT(mean_T.numel() == rows && rstd_T.numel() == rows);
  MOE_DISPATCH_FLOAT(dx_TH.dtype(), T, {
    const T* dres = dres_TH ? dres_TH->data<T>() : nullptr;
    with_storage<T>(x_TH.dtype(), [&](auto* xt) {
      using X = storage_t<decltype(xt)>;
      bwd<T, X>(dy_TH.data<T>(), x_TH.data<X>(), w_H.data<T>(), mean_T.data<T>(), rstd_T.data<T>(), dx_TH.data<T>(),
                dres, dw_H.data<T>(), db_H.data<T>(), rows, H);
    });
  });
}

// This backend's table (kernels/backends.h).
const NormKernels kNormKernels{rmsnorm_forward,   rmsnorm_forward_add,   rmsnorm_backward,
                               layernorm_forward, layernorm_forward_add, layernorm_backward};

}  // namespace moecore::kernels::cpu
