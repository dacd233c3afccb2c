// Element types a Tensor can hold, their sizes and names, and bf16 conversion (round to nearest even).
// Not a general numeric library: only what kernels and file formats need.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace moecore {

enum class DType : uint8_t { F32, BF16, F64, I32, I64 };

constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32:
      return 4;
    case DType::BF16:
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
    case DType::F64:
      return "f64";
    case DType::I32:
      return "i32";
    case DType::I64:
      return "i64";
  }
  return "?";
}

constexpr bool is_floating(DType t) {
  return t == DType::F32 || t == DType::BF16 || t == DType::F64;
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
constexpr DType dtype_of<int32_t>() {
  return DType::I32;
}
template <>
constexpr DType dtype_of<int64_t>() {
  return DType::I64;
}

}  // namespace moecore
