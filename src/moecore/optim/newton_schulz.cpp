// Newton–Schulz orthogonalisation (see newton_schulz.h).
#include "moecore/optim/newton_schulz.h"

#include <array>
#include <cmath>
#include <vector>

#include "moecore/core/error.h"
#include "moecore/kernels/gemm.h"

namespace moecore::optim {

namespace {
using Coeffs = std::array<double, 3>;

// The coefficient sets of emerging_optimizers (muon_utils._COEFFICIENT_SETS).
const std::vector<Coeffs>* coefficient_set(const std::string& type) {
  static const std::vector<Coeffs> simple = {{3.4445, -4.7750, 2.0315}};
  static const std::vector<Coeffs> quintic = {{4.0848, -6.8946, 2.9270},
                                              {3.9505, -6.3029, 2.6377},
                                              {3.7418, -5.5913, 2.3037},
                                              {2.8769, -3.1427, 1.2046},
                                              {2.8366, -3.0525, 1.2012}};
  static const std::vector<Coeffs> polar_express = {
      {8.2051, -22.9019, 16.4607}, {4.0664, -2.8612, 0.5184}, {3.9096, -2.8234, 0.5250}, {3.2856, -2.4153, 0.4853},
      {2.2779, -1.6198, 0.3985},   {1.8726, -1.2307, 0.3585}, {1.8564, -1.2132, 0.3568}, {1.8750, -1.2500, 0.3750}};
  static const std::vector<Coeffs> aol = {
      {4.0098, -7.0585, 2.4635}, {3.4585, -5.5479, 2.5959}, {2.7573, -3.2939, 1.4254}, {2.7215, -3.0494, 1.3169}};
  if (type == "simple") return &simple;
  if (type == "quintic") return &quintic;
  if (type == "polar_express") return &polar_express;
  if (type == "aol") return &aol;
  return nullptr;
}

const Coeffs& coefficients_of_step(const std::vector<Coeffs>& set, const std::string& type, int64_t i) {
  if (type == "polar_express") return set[std::min<size_t>(static_cast<size_t>(i), set.size() - 1)];
  return set[static_cast<size_t>(i) % set.size()];
}

void round_to_bf16(Tensor& t) {
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); i++) p[i] = bf16_to_float(float_to_bf16(p[i]));
}
}  // namespace

void check_newton_schulz(const std::string& type, int64_t steps) {
  const auto* set = coefficient_set(type);
  MOE_CHECK(set, "--muon-coefficient-type {} is not supported; use simple, quintic, polar_express or aol", type);
  MOE_CHECK(steps >= 1, "--muon-num-ns-steps {} must be at least 1", steps);
  const auto n = static_cast<int64_t>(set->size());
  if (type == "polar_express")
    MOE_CHECK(steps >= n, "--muon-num-ns-steps {} must be at least {} for --muon-coefficient-type polar_express", steps,
              n);
  else if (type != "simple")
    MOE_CHECK(steps % n == 0, "--muon-num-ns-steps {} must be a multiple of {} for --muon-coefficient-type {}", steps,
              n, type);
}

Tensor newton_schulz(const Tensor& G, int64_t steps, const std::string& type, bool bf16) {
  MOE_ASSERT(G.ndim() == 2 && G.dtype() == DType::F32);
  const auto* set = coefficient_set(type);
  MOE_ASSERT(set);
  const bool transpose = G.shape()[0] > G.shape()[1];
  const int64_t m = transpose ? G.shape()[1] : G.shape()[0], n = transpose ? G.shape()[0] : G.shape()[1];
  // X [m, n] with m ≤ n, normalised by the Frobenius norm (accumulated in double).
  Tensor X = Tensor::empty({m, n}, DType::F32);
  const float* g = G.data<float>();
  float* x = X.data<float>();
  double sq = 0;
  for (int64_t i = 0; i < G.numel(); i++) sq += static_cast<double>(g[i]) * g[i];
  const float inv = static_cast<float>(1.0 / std::max(std::sqrt(sq), 1e-7));
  for (int64_t r = 0; r < m; r++)
    for (int64_t c = 0; c < n; c++) x[r * n + c] = (transpose ? g[c * m + r] : g[r * n + c]) * inv;
  Tensor A = Tensor::empty({m, m}, DType::F32), AA = Tensor::empty({m, m}, DType::F32);
  Tensor BX = Tensor::empty({m, n}, DType::F32);
  if (bf16) round_to_bf16(X);
  auto op = [bf16](const Tensor& t) { return bf16 ? t.to(DType::BF16) : t; };
  for (int64_t i = 0; i < steps; i++) {
    const Coeffs& k = coefficients_of_step(*set, type, i);
    const Tensor Xo = op(X);
    kernels::gemm(Xo, false, Xo, true, A);  // A = X·Xᵀ
    if (bf16) round_to_bf16(A);
    const Tensor Ao = op(A);
    kernels::gemm(Ao, false, Ao, false, AA);  // A·A
    float* a = A.data<float>();
    const float* aa = AA.data<float>();
    for (int64_t j = 0; j < A.numel(); j++)  // B = b·A + c·A·A (in place of A)
      a[j] = static_cast<float>(k[1]) * a[j] + static_cast<float>(k[2]) * aa[j];
    if (bf16) round_to_bf16(A);
    kernels::gemm(op(A), false, Xo, false, BX);  // B·X
    const float* bx = BX.data<float>();
    for (int64_t j = 0; j < X.numel(); j++) x[j] = static_cast<float>(k[0]) * x[j] + bx[j];
    if (bf16) round_to_bf16(X);
  }
  if (!transpose) return X;
  Tensor out = Tensor::empty(G.shape(), DType::F32);
  float* o = out.data<float>();
  for (int64_t r = 0; r < m; r++)
    for (int64_t c = 0; c < n; c++) o[c * m + r] = x[r * n + c];
  return out;
}

double muon_scale_factor(int64_t rows, int64_t cols, const std::string& mode) {
  const double r = static_cast<double>(rows), c = static_cast<double>(cols);
  if (mode == "spectral") return std::sqrt(std::max(r, c));
  if (mode == "unit_rms_norm") return std::sqrt(r / c);
  if (mode == "shape_scaling") return std::sqrt(std::max(1.0, r / c));
  MOE_CHECK(false, "--muon-scale-mode {} is not supported; use spectral, unit_rms_norm or shape_scaling", mode);
  return 0;
}

}  // namespace moecore::optim
