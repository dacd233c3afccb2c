// RoPE (see rope.h). With a pair (a, b) of channels (rotate half: i and i + h, h = rot_dim/2; interleaved: 2i and
// 2i+1) turned by pair i's angle, c = m·cos, s = m·sin:
//   y_a = a·c − b·s,   y_b = b·c + a·s
// The map is m times a rotation, so backward is the transposed map (s → −s):
//   da = dy_a·c + dy_b·s,  db = dy_b·c − dy_a·s
#include "moecore/kernels/rope.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <type_traits>

#include "moecore/core/cpu.h"
#include "moecore/kernels/backends.h"
#include "moecore/kernels/cpu/kernels.h"

namespace moecore::kernels {

std::vector<double> rope_inv_freq(int64_t rot_dim, double base) {
  MOE_ASSERT_MSG(rot_dim > 0 && rot_dim % 2 == 0, "rotary dim {} must be positive and even", rot_dim);
  std::vector<double> f(static_cast<size_t>(rot_dim / 2));
  for (int64_t i = 0; i < rot_dim / 2; i++)
    f[static_cast<size_t>(i)] = 1.0 / std::pow(base, static_cast<double>(2 * i) / static_cast<double>(rot_dim));
  return f;
}

double yarn_get_mscale(double scale, double mscale) {
  return scale <= 1 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0;
}

double yarn_concentration_factor(const YarnParams& y) {
  return yarn_get_mscale(y.scaling_factor, y.mscale) / yarn_get_mscale(y.scaling_factor, y.mscale_all_dim);
}

std::vector<double> yarn_inv_freq(int64_t rot_dim, double base, const YarnParams& y) {
  const double d = static_cast<double>(rot_dim);
  // The dimension whose wavelength fits n rotations into the original context.
  auto correction_dim = [&](double n) {
    return d * std::log(static_cast<double>(y.original_max_position_embeddings) / (n * 2 * std::numbers::pi)) /
           (2 * std::log(base));
  };
  double lo = correction_dim(y.beta_fast), hi = correction_dim(y.beta_slow);
  if (y.round_to_int) lo = std::floor(lo), hi = std::ceil(hi);
  lo = std::max(lo, 0.0), hi = std::min(hi, d - 1);
  if (lo == hi) hi += 0.001;  // no singular ramp
  std::vector<double> f = rope_inv_freq(rot_dim, base);
  for (size_t i = 0; i < f.size(); i++) {
    const double ramp = std::clamp((static_cast<double>(i) - lo) / (hi - lo), 0.0, 1.0);
    const double extrapolation = 1.0 - ramp;  // weight of the original frequency
    f[i] = f[i] / y.scaling_factor * (1.0 - extrapolation) + f[i] * extrapolation;
  }
  return f;
}

void rope_tables_from(int64_t S, const std::vector<double>& inv_freq, double amplitude, DType dtype, Tensor& cos_SR,
                      Tensor& sin_SR) {
  const int64_t h = static_cast<int64_t>(inv_freq.size());
  MOE_ASSERT(h > 0);
  cos_SR = Tensor::empty({S, h}, dtype);
  sin_SR = Tensor::empty({S, h}, dtype);
  for (int64_t s = 0; s < S; s++)
    for (int64_t i = 0; i < h; i++) {
      const double a = static_cast<double>(s) * inv_freq[static_cast<size_t>(i)];
      cos_SR.set_item(s * h + i, amplitude * std::cos(a));
      sin_SR.set_item(s * h + i, amplitude * std::sin(a));
    }
}

void rope_tables(int64_t S, int64_t rot_dim, double base, DType dtype, Tensor& cos_SR, Tensor& sin_SR) {
  rope_tables_from(S, rope_inv_freq(rot_dim, base), 1.0, dtype, cos_SR, sin_SR);
}

}  // namespace moecore::kernels

namespace moecore::kernels::cpu {

namespace {
// x, y [S, BN, D] (y may be x); cos and sin [≥ S, rot_dim/2].
template <typename T>
MOE_ALWAYS_INLINE void rotate_body(const T* xp, const T* cp, const T* sp, int64_t S, int64_t BN, int64_t D,
                                   int64_t offset, int64_t rot_dim, RopePairs pairs, T* yp, T sign) {
  const int64_t h = rot_dim / 2;
  // Pair i is channels (a_i, b_i) from the rotated window's start.
  const int64_t a_step = pairs == RopePairs::Interleaved ? 2 : 1, b_off = pairs == RopePairs::Interleaved ? 1 : h;
#pragma omp for schedule(static)
  for (int64_t s = 0; s < S; s++) {
    const T* c = cp + s * h;
    const T* sn = sp + s * h;
    for (int64_t r = 0; r < BN; r++) {
      const T* xr = xp + (s * BN + r) * D;
      T* yr = yp + (s * BN + r) * D;
      if (yr != xr) {
        for (int64_t i = 0; i < offset; i++) yr[i] = xr[i];
        for (int64_t i = offset + rot_dim; i < D; i++) yr[i] = xr[i];
      }
      const T* xw = xr + offset;
      T* yw = yr + offset;
      if constexpr (std::is_same_v<T, float>) {
        if (pairs == RopePairs::RotateHalf) {
          rope_row_f32(xw, c, sn, h, sign, rot_dim, yw);
          continue;
        }
      }
      for (int64_t i = 0; i < h; i++) {
        const int64_t ia = i * a_step, ib = ia + b_off;
        const T a = xw[ia], b = xw[ib], si = sign * sn[i];
        yw[ia] = a * c[i] - b * si;
        yw[ib] = b * c[i] + a * si;
      }
    }
  }
}

template <typename T>
void rotate(const Tensor& x, const Tensor& cos_SR, const Tensor& sin_SR, int64_t offset, int64_t rot_dim,
            RopePairs pairs, Tensor& y, T sign) {
  MOE_ASSERT_MSG(x.ndim() == 4, "rope input must be [S, B, N, D], got {}", x.shape().str());
  MOE_ASSERT(y.shape() == x.shape());
  const int64_t S = x.dim(0), BN = x.dim(1) * x.dim(2), D = x.dim(3);
  MOE_ASSERT_MSG(offset >= 0 && offset + rot_dim <= D && rot_dim % 2 == 0, "rotary dims [{}, {}) vs head dim {}",
                 offset, offset + rot_dim, D);
  MOE_ASSERT(cos_SR.dim(0) >= S && cos_SR.dim(1) == rot_dim / 2);
  const T *xp = x.data<T>(), *cp = cos_SR.data<T>(), *sp = sin_SR.data<T>();
  T* yp = y.data<T>();
#pragma omp parallel
  MOE_CPU_CLONES(rotate_body<T>(xp, cp, sp, S, BN, D, offset, rot_dim, pairs, yp, sign));
}
}  // namespace

void rope_forward_at(const Tensor& x_SBND, const Tensor& cos_SR, const Tensor& sin_SR, int64_t offset, int64_t rot_dim,
                     RopePairs pairs, Tensor& y_SBND) {
  MOE_DISPATCH_FLOAT(x_SBND.dtype(), T, rotate<T>(x_SBND, cos_SR, sin_SR, offset, rot_dim, pairs, y_SBND, T(1)));
}

void rope_backward_at(const Tensor& dy_SBND, const Tensor& cos_SR, const Tensor& sin_SR, int64_t offset,
                      int64_t rot_dim, RopePairs pairs, Tensor& dx_SBND) {
  MOE_DISPATCH_FLOAT(dy_SBND.dtype(), T, rotate<T>(dy_SBND, cos_SR, sin_SR, offset, rot_dim, pairs, dx_SBND, T(-1)));
}

// This backend's table (kernels/backends.h).
const RopeKernels kRopeKernels{rope_forward_at, rope_backward_at};

}  // namespace moecore::kernels::cpu
