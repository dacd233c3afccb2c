// RMSNorm forward/backward (see rmsnorm.h). Statistics in f64 for f64 tensors, f32 otherwise; a row whose sum
// of squares overflows is normalized by its largest magnitude first, so no finite input gives inf or NaN.
//
// Gradient, per row with r = rstd, c = Σ_j w_j·dy_j·x_j:
//   y_k = w_k·x_k·r,   ∂r/∂x_k = −r³·x_k/H
//   dx_k = w_k·dy_k·r + c·(−r³·x_k/H) = r·(w_k·dy_k − x_k·r²·c/H)
//   dw_k += Σ_rows dy_k·x_k·r

#include <algorithm>
#include <cmath>

#include "moecore/core/cpu.h"
#include "moecore/kernels/cpu/kernels.h"
#include "moecore/kernels/cpu/vec_math.h"

namespace moecore::kernels::cpu {

namespace {
// Row by row: x += res first when res is given (written back), then y = x·r·w stored as Y. Row sums run in vector
// lanes (omp simd reduction): a fixed order for a given build and CPU, as the other kernels' reductions.
template <typename T, typename Y>
MOE_ALWAYS_INLINE void fwd_body(T* x, const T* res, const T* w, Y* y, T* rstd, int64_t rows, int64_t H, double eps) {
#pragma omp for schedule(static)
  for (int64_t t = 0; t < rows; t++) {
    T* xr = x + t * H;
    if (res)
      for (int64_t j = 0; j < H; j++) xr[j] = xr[j] + res[t * H + j];
    T ss = 0;
#pragma omp simd reduction(+ : ss)
    for (int64_t j = 0; j < H; j++) ss += xr[j] * xr[j];
    T r = T(1) / std::sqrt(ss / T(H) + T(eps));
    if (!std::isfinite(ss)) {
      // The squares overflowed (|x| beyond ~1e19 in f32): the same statistic with the row scaled by its largest
      // magnitude m, rms = m·sqrt(mean((x/m)²) + eps/m²), so any finite row normalizes to finite values.
      T m = 0;
      for (int64_t j = 0; j < H; j++) m = std::max(m, std::fabs(xr[j]));
      T ss_m = 0;
      for (int64_t j = 0; j < H; j++) ss_m += (xr[j] / m) * (xr[j] / m);
      r = T(1) / (m * std::sqrt(ss_m / T(H) + T(eps) / (m * m)));
    }
    rstd[t] = r;
    Y* yr = y + t * H;
    for (int64_t j = 0; j < H; j++) store_as(yr + j, xr[j] * r * w[j]);
  }
}
template <typename T, typename Y>
void fwd(T* x, const T* res, const T* w, Y* y, T* rstd, int64_t rows, int64_t H, double eps) {
#pragma omp parallel
  MOE_CPU_CLONES(fwd_body<T, Y>(x, res, w, y, rstd, rows, H, eps));
}

// X: T, or bf16 (an input kept rounded for backward, widened as it is read).
template <typename T, typename X>
MOE_ALWAYS_INLINE void bwd_body(const T* dy, const X* x, const T* w, const T* rstd, T* dx, const T* dres, T* dw,
                                int64_t rows, int64_t H) {
#pragma omp for schedule(static)
  for (int64_t t = 0; t < rows; t++) {
    const X* xr = x + t * H;
    const T* dyr = dy + t * H;
    const T r = rstd[t];
    T c = 0;
#pragma omp simd reduction(+ : c)
    for (int64_t j = 0; j < H; j++) c += w[j] * dyr[j] * load_as<T>(xr + j);
    const T k = r * r * c / T(H);
    T* dxr = dx + t * H;
    for (int64_t j = 0; j < H; j++) dxr[j] = r * (w[j] * dyr[j] - load_as<T>(xr + j) * k);
    // The residual's gradient in a loop of its own over the row (still in L1): in one expression the compiler
    // would contract the product and the add into an FMA, and the bits would differ from a separate add_.
    if (dres)
      for (int64_t j = 0; j < H; j++) dxr[j] = dxr[j] + dres[t * H + j];
  }
  // dw: each thread owns a column range and walks rows in order, so the sum order is fixed.
  constexpr int64_t kCols = 64;
  const int64_t nblk = (H + kCols - 1) / kCols;
#pragma omp for schedule(static)
  for (int64_t b = 0; b < nblk; b++) {
    const int64_t j0 = b * kCols, j1 = std::min(H, j0 + kCols);
    T acc[kCols] = {};
    for (int64_t t = 0; t < rows; t++) {
      const T r = rstd[t];
      for (int64_t j = j0; j < j1; j++) acc[j - j0] += dy[t * H + j] * load_as<T>(x + t * H + j) * r;
    }
    for (int64_t j = j0; j < j1; j++) dw[j] += acc[j - j0];
  }
}
template <typename T, typename X>
void bwd(const T* dy, const X* x, const T* w, const T* rstd, T* dx, const T* dres, T* dw, int64_t rows, int64_t H) {
#pragma omp parallel
  MOE_CPU_CLONES(bwd_body<T, X>(dy, x, w, rstd, dx, dres, dw, rows, H));
}

void forward_impl(Tensor& x_TH, const Tensor* res_TH, const Tensor& w_H, double eps, Tensor& y_TH, Tensor& rstd_T) {
  const int64_t H = x_TH.cols(), rows = x_TH.rows();
  MOE_ASSERT_SHAPE(w_H, {H});
  MOE_ASSERT(y_TH.shape() == x_TH.shape() && rstd_T.numel() == rows);
  MOE_ASSERT(!res_TH || (res_TH->numel() == x_TH.numel() && res_TH->dtype() == x_TH.dtype()));
  MOE_ASSERT(y_TH.dtype() == x_TH.dtype() || (is_half(y_TH.dtype()) && x_TH.dtype() == DType::F32));
  MOE_DISPATCH_FLOAT(x_TH.dtype(), T, {
    const T* res = res_TH ? res_TH->data<T>() : nullptr;
    with_storage<T>(y_TH.dtype(), [&](auto* yt) {
      using Y = storage_t<decltype(yt)>;
      fwd<T, Y>(x_TH.data<T>(), res, w_H.data<T>(), y_TH.data<Y>(), rstd_T.data<T>(), rows, H, eps);
    });
  });
}
}  // namespace

void rmsnorm_forward(const Tensor& x_TH, const Tensor& w_H, double eps, Tensor& y_TH, Tensor& rstd_T) {
  Tensor x = x_TH;  // not written: no residual
  forward_impl(x, nullptr, w_H, eps, y_TH, rstd_T);
}

void rmsnorm_forward_add(Tensor& x_TH, const Tensor& res_TH, const Tensor& w_H, double eps, Tensor& y_TH,
                         Tensor& rstd_T) {
  forward_impl(x_TH, &res_TH, w_H, eps, y_TH, rstd_T);
}

void rmsnorm_backward(const Tensor& dy_TH, const Tensor& x_TH, const Tensor& w_H, const Tensor& rstd_T, Tensor& dx_TH,
                      Tensor& dw_H, const Tensor* dres_TH) {
  MOE_ASSERT(!dres_TH || (dres_TH->numel() == x_TH.numel() && dres_TH->dtype() == dx_TH.dtype()));
  const int64_t H = x_TH.cols(), rows = x_TH.rows();
  MOE_ASSERT(dy_TH.shape() == x_TH.shape() && dx_TH.shape() == x_TH.shape());
  MOE_ASSERT(dy_TH.dtype() == dx_TH.dtype() && (x_TH.dtype() == dx_TH.dtype() || is_half(x_TH.dtype())));
  MOE_ASSERT_SHAPE(w_H, {H});
  MOE_ASSERT_SHAPE(dw_H, {H});
  MOE_ASSERT(rstd_T.numel() == rows);
  MOE_DISPATCH_FLOAT(dx_TH.dtype(), T, {
    const T* dres = dres_TH ? dres_TH->data<T>() : nullptr;
    with_storage<T>(x_TH.dtype(), [&](auto* xt) {
      using X = storage_t<decltype(xt)>;
      bwd<T, X>(dy_TH.data<T>(), x_TH.data<X>(), w_H.data<T>(), rstd_T.data<T>(), dx_TH.data<T>(), dres, dw_H.data<T>(),
                rows, H);
    });
  });
}

}  // namespace moecore::kernels::cpu
