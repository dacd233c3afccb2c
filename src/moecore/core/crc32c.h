// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), table-driven, and the masked form that TFRecord framing
// (TensorBoard event files) stores. No Debian C++ library provides it; the check value crc32c("123456789") is
// 0xE3069283.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace moecore {

// CRC-32C of `n` bytes at `data`, continuing from `crc` (0 to start).
uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);
inline uint32_t crc32c(std::string_view s) {
  return crc32c(s.data(), s.size());
}
// TFRecord's masking: ((crc >> 15) | (crc << 17)) + 0xa282ead8, so that a CRC stored inside CRC'd data does not
// weaken the outer check.
inline uint32_t mask_crc32c(uint32_t crc) {
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

}  // namespace moecore
