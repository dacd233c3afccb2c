// Element helpers that keep the kernels' loops vectorizable.
//
// vexp: a branch-free exp (libm's exp is a call per element). Range reduction
// x = n·ln2 + r, |r| ≤ ln2/2 (n rounded to nearest), then a Taylor polynomial (degree 7 for f32, 12 for f64: truncation
// below one ulp) scaled by 2^n built in the exponent bits. Inputs below the underflow limit (including −inf) give the
// smallest normal number's neighbourhood (≤ 1e-37 for f32), which every caller here multiplies into sums of O(1) terms.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "moecore/core/dtype.h"

namespace moecore::kernels {

// Stores v into an output element of type O: T itself, or bf16 (f16) rounded to nearest even as Tensor::to rounds (the
// cast fused into the op that produces a tensor a bf16 GEMM reads). bf16 goes through its uint16_t bits: a struct
// store keeps the loop from vectorizing.
template <typename O, typename T>
inline void store_as(O* p, T v) {
  if constexpr (std::is_same_v<O, bf16>)
    *reinterpret_cast<uint16_t*>(p) = float_to_bf16(static_cast<float>(v)).bits;
  else if constexpr (std::is_same_v<O, f16>)
    *reinterpret_cast<uint16_t*>(p) = float_to_f16(static_cast<float>(v)).bits;
  else
    *p = v;
}

// Reads an element of type X (T itself, or bf16 or f16, widened exactly) as T: the loads of an op whose input a GEMM or
// another op wrote in bf16.
template <typename T, typename X>
inline T load_as(const X* p) {
  if constexpr (std::is_same_v<X, bf16>)
    return static_cast<T>(std::bit_cast<float>(static_cast<uint32_t>(*reinterpret_cast<const uint16_t*>(p)) << 16));
  else if constexpr (std::is_same_v<X, f16>)
    return static_cast<T>(f16_to_float(*p));
  else
    return static_cast<T>(*p);
}

// Calls f with a null pointer of the storage type of a tensor of dtype `dt` whose computation type is T: bf16, f16,
// or T itself (the storage of an op's input or output that a 16-bit GEMM reads or wrote).
template <typename T, typename F>
inline void with_storage(DType dt, F&& f) {
  if (dt == DType::BF16)
    f(static_cast<bf16*>(nullptr));
  else if (dt == DType::F16)
    f(static_cast<f16*>(nullptr));
  else
    f(static_cast<T*>(nullptr));
}
template <typename P>
using storage_t = std::remove_pointer_t<P>;

// vexp's f32 operations on F: a float, or a GCC vector of floats (attention_native_softmax.h), whose to_int converts
// to integers of its width and from_bits reinterprets them. (A vector F passes only between functions inlined into
// one level's copy of a loop, MOE_CPU_CLONES: no ABI boundary.)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"
template <typename F, typename ToInt, typename FromBits>
inline __attribute__((always_inline)) F vexp_f32(F x, ToInt to_int, FromBits from_bits) {
  const F lo = F{} - 87.0f, hi = F{} + 88.0f;
  x = x < lo ? lo : (x > hi ? hi : x);
  // n = round(x·log2 e) by the 1.5·2^23 trick: std::floor would keep the loop from vectorizing.
  const F n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  const F r = (x - n * 0.693359375f) + n * 2.12194440e-4f;  // ln2 split in two for exactness
  F p = F{} + 1.0f / 5040;
  p = p * r + 1.0f / 720;
  p = p * r + 1.0f / 120;
  p = p * r + 1.0f / 24;
  p = p * r + 1.0f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  // A NaN input stays NaN through p; only the exponent's integer conversion needs a number (NaN to int is UB).
  return p * from_bits((to_int(n == n ? n : F{}) + 127) << 23);
}
#pragma GCC diagnostic pop

inline float vexp(float x) {
  return vexp_f32(
      x, [](float n) { return static_cast<int32_t>(n); }, [](int32_t e) { return std::bit_cast<float>(e); });
}

inline double vexp(double x) {
  x = x < -708.0 ? -708.0 : (x > 709.0 ? 709.0 : x);
  const double n = (x * 1.4426950408889634 + 6755399441055744.0) - 6755399441055744.0;
  const double r = (x - n * 0.6931471803691238) - n * 1.9082149292705877e-10;
  double p = 1.0 / 479001600;
  p = p * r + 1.0 / 39916800;
  p = p * r + 1.0 / 3628800;
  p = p * r + 1.0 / 362880;
  p = p * r + 1.0 / 40320;
  p = p * r + 1.0 / 5040;
  p = p * r + 1.0 / 720;
  p = p * r + 1.0 / 120;
  p = p * r + 1.0 / 24;
  p = p * r + 1.0 / 6;
  p = p * r + 0.5;
  p = p * r + 1.0;
  p = p * r + 1.0;
  const double scale = std::bit_cast<double>((static_cast<int64_t>(n == n ? n : 0.0) + 1023) << 52);
  return p * scale;
}

}  // namespace moecore::kernels
