// A compiled PCRE2 pattern (UTF + Unicode properties, JIT) that the tokenizer's normalizers, pre-tokenizers and
// BPE trainer match with; shared by threads, each bringing its own match data. Not a general regex API.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

struct pcre2_real_code_8;  // pcre2_code for 8-bit code units

namespace moecore::data {

class Regex {
 public:
  // `where` names the pattern's origin in the error when it does not compile.
  Regex(const std::string& pattern, const std::string& where);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Calls fn(start, end) for every non-empty match in s, left to right.
  template <typename Fn>
  void for_each_match(std::string_view s, Fn fn) const {
    size_t pos = 0, a = 0, b = 0;
    while (next_match(s, pos, a, b)) fn(a, b);
  }

 private:
  // The next non-empty match at or after `pos` as [a, b); advances `pos` past it. False when there is none.
  bool next_match(std::string_view s, size_t& pos, size_t& a, size_t& b) const;

  pcre2_real_code_8* code_ = nullptr;
};

}  // namespace moecore::data
