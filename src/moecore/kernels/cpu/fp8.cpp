// FP8 quantize-dequantize on the CPU (see kernels/fp8.h). Rounding works on the value's binade: the grid step there
// is 2^(e − mantissa bits), or the subnormal step below the smallest normal, and nearbyint divides by a power of two
// exactly and rounds ties to even.
#include "moecore/kernels/fp8.h"

#include <algorithm>
#include <cfloat>
#include <cmath>

#include "moecore/kernels/cpu/kernels.h"

namespace moecore::kernels {

namespace {

struct Fp8Grid {
  int mantissa_bits;
  int min_normal_exp;  // exponent of the smallest normal value
  float max;
};

Fp8Grid grid_of(Fp8Format f) {
  return f == Fp8Format::E4M3 ? Fp8Grid{3, -6, 448.0f} : Fp8Grid{2, -14, 57344.0f};
}

// The tensor's values as f32 (bf16 widened exactly).
Tensor as_f32(const Tensor& x, const char* op) {
  cpu::require_cpu(x, op);
  MOE_ASSERT_MSG(x.dtype() == DType::F32 || x.dtype() == DType::BF16, "{}: f32 or bf16 operands, got {}", op,
                 dtype_name(x.dtype()));
  return x.as_dtype(DType::F32);
}

}  // namespace

const char* fp8_format_name(Fp8Format f) {
  return f == Fp8Format::E4M3 ? "e4m3" : "e5m2";
}

double fp8_max(Fp8Format f) {
  return grid_of(f).max;
}

float fp8_round(float v, Fp8Format f) {
  if (std::isnan(v)) return v;
  const Fp8Grid g = grid_of(f);
  const double a = std::fabs(static_cast<double>(v));
  if (a >= g.max) return std::copysign(g.max, v);
  if (a == 0) return v;
  int e = 0;
  std::frexp(a, &e);  // a = m·2^e with m in [0.5, 1): the binade's exponent is e − 1
  const int step_exp = std::max(e - 1, g.min_normal_exp) - g.mantissa_bits;
  const double q = std::ldexp(std::nearbyint(std::ldexp(a, -step_exp)), step_exp);
  return static_cast<float>(std::copysign(std::min(q, static_cast<double>(g.max)), static_cast<double>(v)));
}

double fp8_amax(const Tensor& x) {
  const Tensor xf = as_f32(x, "fp8_amax");
  const float* p = xf.data<float>();
  const int64_t n = xf.numel();
  double amax = 0;
  bool nan = false;
  for (int64_t i = 0; i < n; i++) {
    const float a = std::fabs(p[i]);
    if (std::isnan(a)) nan = true;
    amax = std::max(amax, static_cast<double>(a));
  }
  return nan ? std::nan("") : amax;
}

uint8_t fp8_encode(float v, Fp8Format f) {
  const Fp8Grid g = grid_of(f);
  const int bias = 1 - g.min_normal_exp;  // E4M3 7, E5M2 15
  const uint8_t sign = std::signbit(v) ? 0x80 : 0;
  const double a = std::fabs(static_cast<double>(v));
  MOE_ASSERT_MSG(std::isfinite(a) && a <= g.max, "fp8_encode of {}", v);
  if (a == 0) return sign;
  int e = 0;
  std::frexp(a, &e);
  const int exp = std::max(e - 1, g.min_normal_exp);  // the binade (subnormals: the smallest normal's)
  const auto steps = static_cast<int64_t>(std::ldexp(a, g.mantissa_bits - exp));  // exact: v is on the grid
  const int64_t field = e - 1 < g.min_normal_exp ? 0 : exp + bias;
  const int64_t mantissa = steps - (field == 0 ? 0 : (int64_t{1} << g.mantissa_bits));
  return static_cast<uint8_t>(sign | (field << g.mantissa_bits) | mantissa);
}

float fp8_decode(uint8_t code, Fp8Format f) {
  const Fp8Grid g = grid_of(f);
  const int bias = 1 - g.min_normal_exp;
  const int field = (code & 0x7F) >> g.mantissa_bits, mantissa = code & ((1 << g.mantissa_bits) - 1);
  const double a = field == 0 ? std::ldexp(mantissa, g.min_normal_exp - g.mantissa_bits)
                              : std::ldexp((1 << g.mantissa_bits) + mantissa, field - bias - g.mantissa_bits);
  return static_cast<float>((code & 0x80) ? -a : a);
}

// fp8 · inv in f32, saturated to ±FLT_MAX: near FLT_MAX a value rounded up to the next FP8 step would overflow.
float fp8_dequantize(float fp8, float inv) {
  return std::clamp(fp8 * inv, -FLT_MAX, FLT_MAX);
}
static float fp8_dequantized(float fp8, float inv) {
  return fp8_dequantize(fp8, inv);
}

float fp8_scale_from_amax(double amax, Fp8Format f, bool pow2) {
  MOE_ASSERT_MSG(std::isfinite(amax) && amax >= 0, "fp8 scale of a non-finite amax {}", amax);
  if (amax == 0) return 1.0f;
  double s = fp8_max(f) / amax;
  if (s > FLT_MAX) s = FLT_MAX;
  if (pow2) {
    int e = 0;
    std::frexp(s, &e);
    s = std::ldexp(1.0, e - 1);  // the largest power of two not above s
  }
  return static_cast<float>(s);
}

void fp8_quantize_tensorwise(const Tensor& x, Fp8Format f, float scale, Tensor& y) {
  const Tensor xf = as_f32(x, "fp8_quantize_tensorwise");
  MOE_ASSERT(y.dtype() == DType::F32 && y.numel() == x.numel() && scale > 0);
  const float inv = 1.0f / scale;
  const float* p = xf.data<float>();
  float* q = y.data<float>();
  const int64_t n = xf.numel();
#pragma omp parallel for schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; i++) q[i] = fp8_dequantized(fp8_round(p[i] * scale, f), inv);
}

void fp8_quantize_blockwise(const Tensor& x, Fp8Format f, int64_t block_rows, int64_t block_cols, bool pow2,
                            Tensor& y) {
  const Tensor xf = as_f32(x, "fp8_quantize_blockwise");
  MOE_ASSERT(y.dtype() == DType::F32 && y.numel() == x.numel() && block_rows > 0 && block_cols > 0);
  const int64_t R = xf.rows(), C = xf.cols();
  const float* p = xf.data<float>();
  float* q = y.data<float>();
  const int64_t nbr = (R + block_rows - 1) / block_rows, nbc = (C + block_cols - 1) / block_cols;
#pragma omp parallel for schedule(static) if (R * C > 65536)
  for (int64_t b = 0; b < nbr * nbc; b++) {
    const int64_t r0 = (b / nbc) * block_rows, c0 = (b % nbc) * block_cols;
    const int64_t r1 = std::min(R, r0 + block_rows), c1 = std::min(C, c0 + block_cols);
    double amax = 0;
    for (int64_t r = r0; r < r1; r++)
      for (int64_t c = c0; c < c1; c++) amax = std::max(amax, static_cast<double>(std::fabs(p[r * C + c])));
    const float scale = fp8_scale_from_amax(amax, f, pow2), inv = 1.0f / scale;
    for (int64_t r = r0; r < r1; r++)
      for (int64_t c = c0; c < c1; c++) q[r * C + c] = fp8_dequantized(fp8_round(p[r * C + c] * scale, f), inv);
  }
}

}  // namespace moecore::kernels
