// Element types a Tensor can hold, their sizes and names, and the bf16 and IEEE half (f16) conversions (round to
// nearest even; f16 with subnormals, overflow to inf and NaN kept quiet).
// Not a general numeric library: only what kernels and file formats need.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace moecore {

enum class DType : uint8_t { F32, BF16, F64, I32, I64, F16 };

constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32:
      return 4;
    case DType::BF16:
    case DType::F16:
      return 2;
    case DType::F64:
      return 8;
    case DType::I32:
      return 4;
    case DType::I64:
      return 8;
  }
  return 0;
}

constexpr std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::F32:
      return "f32";
    case DType::BF16:
      return "bf16";
    case DType::F16:
      return "f16";
    case DType::F64:
      return "f64";
    case DType::I32:
      return "i32";
    case DType::I64:
      return "i64";
  }
  return "?";
}

// A 16-bit float: the storage of a model's GEMM operands and weights under --bf16 or --fp16.
constexpr bool is_half(DType t) {
  return t == DType::BF16 || t == DType::F16;
}

// The 16-bit float a model computes in (GEMM operands with f32 accumulation, weights stored with f32 masters,
// activations kept between ops): BF16 under --bf16, F16 under --fp16, none (all f32) otherwise. Built once from the
// config (train::gpt_config) and handed to every module's config.
using LowPrecision = std::optional<DType>;

constexpr bool is_floating(DType t) {
  return t == DType::F32 || t == DType::BF16 || t == DType::F64 || t == DType::F16;
}

// bfloat16 storage type: the upper 16 bits of an IEEE f32.
struct bf16 {
  uint16_t bits;
};

inline float bf16_to_float(bf16 v) {
  return std::bit_cast<float>(static_cast<uint32_t>(v.bits) << 16);
}

// Round to nearest, ties to even; NaN stays NaN (quiet). Branch-free, so conversion loops vectorize.
inline bf16 float_to_bf16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (u >> 16) | 0x40u;
  const bool is_nan = (u & 0x7FFFFFFFu) > 0x7F800000u;
  return bf16{static_cast<uint16_t>(is_nan ? quiet_nan : rounded)};
}

// IEEE 754 binary16 storage type: 1 sign, 5 exponent (bias 15), 10 mantissa bits; largest finite 65504, smallest
// normal 2^-14, smallest subnormal 2^-24.
struct f16 {
  uint16_t bits;
};

// Exact: every half is an f32.
inline float f16_to_float(f16 v) {
  const uint32_t h = v.bits;
  const uint32_t sign = (h & 0x8000u) << 16, e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
  if (e == 0) {  // zero or subnormal: m * 2^-24
    const float mag = static_cast<float>(m) * 0x1p-24f;
    return std::bit_cast<float>(std::bit_cast<uint32_t>(mag) | sign);
  }
  if (e == 31) return std::bit_cast<float>(sign | 0x7F800000u | (m << 13));  // inf, NaN (payload kept)
  return std::bit_cast<float>(sign | ((e + 112u) << 23) | (m << 13));
}

// Round to nearest, ties to even: values from 65520 up (half-way past 65504) become inf, values under 2^-14 the
// nearest subnormal (or zero, signed), NaN stays NaN (quiet, the top payload bits kept).
inline f16 float_to_f16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7FFFFFFFu;
  uint32_t h;
  if (a > 0x7F800000u) {
    h = 0x7E00u | ((a >> 13) & 0x3FFu);
  } else if (a >= 0x477FF000u) {  // 65520 and up, and inf
    h = 0x7C00u;
  } else if (a >= 0x38800000u) {  // normal: rebias the exponent (127 - 15), round the 13 dropped bits
    const uint32_t r = a - 0x38000000u;
    h = (r + 0xFFFu + ((r >> 13) & 1u)) >> 13;
  } else {  // subnormal: the f32 sum with 0.5 (whose ulp is 2^-24) rounds |f| to a multiple of 2^-24, ties to even
    h = std::bit_cast<uint32_t>(std::bit_cast<float>(a) + 0.5f) - 0x3F000000u;
  }
  return f16{static_cast<uint16_t>(sign | h)};
}

template <typename T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() {
  return DType::F32;
}
template <>
constexpr DType dtype_of<double>() {
  return DType::F64;
}
template <>
constexpr DType dtype_of<bf16>() {
  return DType::BF16;
}
template <>
constexpr DType dtype_of<f16>() {
  return DType::F16;
}
template <>
constexpr DType dtype_of<int32_t>() {
  return DType::I32;
}
template <>
constexpr DType dtype_of<int64_t>() {
  return DType::I64;
}

}  // namespace moecore
