// UTF-8 helpers the tokenizer shares: validation and encoding one code point. Not normalization (utf8proc does
// that in the text pipeline) and not the byte-level alphabet (byte_level.h).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace moecore::data {

// Checks that `text` is valid UTF-8; returns the byte offset of the first invalid sequence, or -1.
int64_t find_invalid_utf8(std::string_view text);

// The UTF-8 bytes of code point `cp`.
std::string encode_utf8(uint32_t cp);

}  // namespace moecore::data
