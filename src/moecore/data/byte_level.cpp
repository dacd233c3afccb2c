// GPT-2's byte-level alphabet (see byte_level.h).
#include "moecore/data/byte_level.h"

#include <utf8proc.h>

#include <vector>

#include "moecore/data/utf8.h"

namespace moecore::data {

const std::array<uint32_t, 256>& byte_to_codepoint() {
  static const std::array<uint32_t, 256> map = [] {
    std::array<uint32_t, 256> m{};
    std::array<bool, 256> direct{};
    for (int b = '!'; b <= '~'; b++) direct[b] = true;
    for (int b = 0xA1; b <= 0xAC; b++) direct[b] = true;
    for (int b = 0xAE; b <= 0xFF; b++) direct[b] = true;
    uint32_t next = 256;
    for (int b = 0; b < 256; b++) m[b] = direct[b] ? static_cast<uint32_t>(b) : next++;
    return m;
  }();
  return map;
}

namespace {
// Code point -> byte, -1 outside the alphabet. The alphabet's largest code point is 256 + 67.
int codepoint_to_byte(uint32_t cp) {
  static const std::vector<int> inverse = [] {
    std::vector<int> inv(256 + 68, -1);
    const auto& b2c = byte_to_codepoint();
    for (int b = 0; b < 256; b++) inv[b2c[b]] = b;
    return inv;
  }();
  return cp < inverse.size() ? inverse[cp] : -1;
}
}  // namespace

std::string byte_level_spell(std::string_view raw) {
  const auto& b2c = byte_to_codepoint();
  std::string s;
  for (unsigned char ch : raw) s += encode_utf8(b2c[ch]);
  return s;
}

std::optional<std::string> byte_level_unspell(std::string_view spelled) {
  std::string raw;
  size_t i = 0;
  while (i < spelled.size()) {
    utf8proc_int32_t cp;
    const auto n = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(spelled.data()) + i,
                                    static_cast<utf8proc_ssize_t>(spelled.size() - i), &cp);
    if (n <= 0) return std::nullopt;
    const int b = codepoint_to_byte(static_cast<uint32_t>(cp));
    if (b < 0) return std::nullopt;
    raw += static_cast<char>(b);
    i += static_cast<size_t>(n);
  }
  return raw;
}

}  // namespace moecore::data
