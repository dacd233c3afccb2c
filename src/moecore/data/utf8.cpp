// UTF-8 helpers (see utf8.h), on utf8proc.
#include "moecore/data/utf8.h"

#include <utf8proc.h>

namespace moecore::data {

int64_t find_invalid_utf8(std::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    utf8proc_int32_t cp;
    const auto n = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(text.data()) + i,
                                    static_cast<utf8proc_ssize_t>(text.size() - i), &cp);
    if (n < 0) return static_cast<int64_t>(i);
    i += static_cast<size_t>(n);
  }
  return -1;
}

std::string encode_utf8(uint32_t cp) {
  std::string s;
  utf8proc_uint8_t buf[4];
  const auto n = utf8proc_encode_char(static_cast<utf8proc_int32_t>(cp), buf);
  s.assign(reinterpret_cast<char*>(buf), static_cast<size_t>(n));
  return s;
}

}  // namespace moecore::data
