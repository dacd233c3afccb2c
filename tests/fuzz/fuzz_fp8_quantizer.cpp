// libFuzzer target: the FP8 quantizer (kernels/fp8.h) on arbitrary f32 bit patterns (NaN, infinities, subnormals,
// huge and tiny values). Input: a byte choosing the format and tiling, then f32 values. Properties: a rounded value
// is NaN exactly when the input is, lies within ±max, and rounds to itself; amax is NaN or infinite exactly when
// an input is; quantizing a finite tensor, tensorwise or blockwise, gives finite values within each scale's range.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "moecore/core/error.h"
#include "moecore/kernels/fp8.h"

using moecore::kernels::Fp8Format;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1 + sizeof(float)) return 0;
  const Fp8Format f = (data[0] & 1) ? Fp8Format::E5M2 : Fp8Format::E4M3;
  const int64_t n = static_cast<int64_t>((size - 1) / sizeof(float));
  moecore::Tensor x = moecore::Tensor::empty({n}, moecore::DType::F32);
  std::memcpy(x.data<float>(), data + 1, static_cast<size_t>(n) * sizeof(float));
  const double mx = moecore::kernels::fp8_max(f);
  bool finite = true;
  for (int64_t i = 0; i < n; i++) {
    const float v = x.data<float>()[i];
    const float r = moecore::kernels::fp8_round(v, f);
    if (std::isnan(v) != std::isnan(r)) std::abort();
    if (std::isnan(v)) {
      finite = false;
      continue;
    }
    if (!std::isfinite(v)) finite = false;
    if (std::fabs(r) > mx || moecore::kernels::fp8_round(r, f) != r) std::abort();
  }
  const double amax = moecore::kernels::fp8_amax(x);
  if (std::isfinite(amax) != finite) std::abort();
  if (!finite) return 0;
  moecore::Tensor y = moecore::Tensor::empty({n}, moecore::DType::F32);
  moecore::kernels::fp8_quantize_tensorwise(x, f, moecore::kernels::fp8_scale_from_amax(amax, f, false), y);
  for (int64_t i = 0; i < n; i++)
    if (!std::isfinite(y.data<float>()[i])) std::abort();
  const moecore::Tensor x2 = x.reshape({1, n});
  moecore::Tensor y2 = moecore::Tensor::empty({1, n}, moecore::DType::F32);
  moecore::kernels::fp8_quantize_blockwise(x2, f, 1, (data[0] & 2) ? 128 : 32, true, y2);
  for (int64_t i = 0; i < n; i++)
    if (!std::isfinite(y2.data<float>()[i])) std::abort();
  return 0;
}
