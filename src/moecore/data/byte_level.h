// GPT-2's byte-level alphabet (bytes_to_unicode): every byte has a printable character, so byte-level BPE
// vocabularies and merges are spelled as text. The one copy of the map; not the ByteLevel pre-tokenizer's regex.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace moecore::data {

// Byte -> the code point that spells it: printable Latin-1 bytes stand for themselves, the other 68 bytes take
// 256, 257, ... in byte order.
const std::array<uint32_t, 256>& byte_to_codepoint();

// Raw bytes -> their byte-level spelling (UTF-8).
std::string byte_level_spell(std::string_view raw);

// A byte-level spelling -> raw bytes; nullopt when `spelled` is not valid UTF-8 or holds a character outside the
// alphabet (special tokens listed in a vocabulary, for example).
std::optional<std::string> byte_level_unspell(std::string_view spelled);

}  // namespace moecore::data
