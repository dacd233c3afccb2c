// Element types a Tensor can hold, their sizes and names, and bf16 conversion (round to nearest even).
// Not a general numeric library: only what kernels and file formats need.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace moecore {

enum class DType : uint8_t { F32, BF16, F64, I32, I64 };

constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::BF16: return 2;
    case DType::F64: return 8;
    case DType::I32: return 4;
    case DType::I64: return 8;
  }
  return 0;
}

constexpr std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "f32";
    case DType::BF16: return "bf16";
    case DType::F64: return "f64";
    case DType::I32: return "i32";
    case DType::I64: return "i64";
  }
  return "?";
}

constexpr bool is_floating(DType t) { return t == DType::F32 || t == DType::BF16 || t == DType::F64; }

// bfloat16 storage type: the upper 16 bits of an IEEE f32.
struct bf16 {
  uint16_t bits;
};

inline float bf16_to_float(bf16 v) {
  uint32_t u = static_cast<uint32_t>(v.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round to nearest, ties to even; NaN stays NaN (quiet).
inline bf16 float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if (std::isnan(f)) return bf16{static_cast<uint16_t>((u >> 16) | 0x40)};
  uint32_t rounding = 0x7FFF + ((u >> 16) & 1);
  return bf16{static_cast<uint16_t>((u + rounding) >> 16)};
}

template <typename T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() { return DType::F32; }
template <>
constexpr DType dtype_of<double>() { return DType::F64; }
template <>
constexpr DType dtype_of<bf16>() { return DType::BF16; }
template <>
constexpr DType dtype_of<int32_t>() { return DType::I32; }
template <>
constexpr DType dtype_of<int64_t>() { return DType::I64; }

}  // namespace moecore
