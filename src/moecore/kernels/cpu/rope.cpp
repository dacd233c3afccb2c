// RoPE (see rope.h). With h = rot_dim/2, for i < h:
//   y_i   = x_i·cos − x_{i+h}·sin,   y_{i+h} = x_{i+h}·cos + x_i·sin
// The map is a rotation, so backward is the inverse rotation (sin → −sin):
//   dx_i  = dy_i·cos + dy_{i+h}·sin,  dx_{i+h} = dy_{i+h}·cos − dy_i·sin
#include "moecore/kernels/cpu/rope.h"

#include <cmath>

namespace moecore::kernels {

void rope_tables(int64_t S, int64_t rot_dim, double base, DType dtype, Tensor& cos_SR, Tensor& sin_SR) {
  MOE_ASSERT_MSG(rot_dim > 0 && rot_dim % 2 == 0, "rotary dim {} must be positive and even", rot_dim);
  const int64_t h = rot_dim / 2;
  cos_SR = Tensor::empty({S, h}, dtype);
  sin_SR = Tensor::empty({S, h}, dtype);
  for (int64_t s = 0; s < S; s++)
    for (int64_t i = 0; i < h; i++) {
      double inv_freq = 1.0 / std::pow(base, static_cast<double>(2 * i) / static_cast<double>(rot_dim));
      double a = static_cast<double>(s) * inv_freq;
      cos_SR.set_item(s * h + i, std::cos(a));
      sin_SR.set_item(s * h + i, std::sin(a));
    }
}

namespace {
template <typename T>
void rotate(const Tensor& x, const Tensor& cos_SR, const Tensor& sin_SR, int64_t rot_dim, Tensor& y, T sign) {
  MOE_ASSERT_MSG(x.ndim() == 4, "rope input must be [S, B, N, D], got {}", x.shape().str());
  MOE_ASSERT(y.shape() == x.shape());
  const int64_t S = x.dim(0), BN = x.dim(1) * x.dim(2), D = x.dim(3), h = rot_dim / 2;
  MOE_ASSERT_MSG(rot_dim <= D && rot_dim % 2 == 0, "rotary dim {} vs head dim {}", rot_dim, D);
  MOE_ASSERT(cos_SR.dim(0) >= S && cos_SR.dim(1) == h);
  const T* xp = x.data<T>();
  T* yp = y.data<T>();
  const T* cp = cos_SR.data<T>();
  const T* sp = sin_SR.data<T>();
#pragma omp parallel for schedule(static)
  for (int64_t s = 0; s < S; s++) {
    const T* c = cp + s * h;
    const T* sn = sp + s * h;
    for (int64_t r = 0; r < BN; r++) {
      const T* xr = xp + (s * BN + r) * D;
      T* yr = yp + (s * BN + r) * D;
      for (int64_t i = 0; i < h; i++) {
        const T a = xr[i], b = xr[i + h], si = sign * sn[i];
        yr[i] = a * c[i] - b * si;
        yr[i + h] = b * c[i] + a * si;
      }
      if (yr != xr)
        for (int64_t i = rot_dim; i < D; i++) yr[i] = xr[i];
    }
  }
}
}  // namespace

void rope_forward(const Tensor& x_SBND, const Tensor& cos_SR, const Tensor& sin_SR, int64_t rot_dim, Tensor& y_SBND) {
  MOE_DISPATCH_FLOAT(x_SBND.dtype(), T, rotate<T>(x_SBND, cos_SR, sin_SR, rot_dim, y_SBND, T(1)));
}

void rope_backward(const Tensor& dy_SBND, const Tensor& cos_SR, const Tensor& sin_SR, int64_t rot_dim,
                   Tensor& dx_SBND) {
  MOE_DISPATCH_FLOAT(dy_SBND.dtype(), T, rotate<T>(dy_SBND, cos_SR, sin_SR, rot_dim, dx_SBND, T(-1)));
}

}  // namespace moecore::kernels
