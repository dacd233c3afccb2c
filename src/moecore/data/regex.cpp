// PCRE2 matching for the tokenizer (see regex.h).
#include "moecore/data/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <type_traits>

#include "moecore/core/error.h"

static_assert(std::is_same_v<pcre2_code, pcre2_real_code_8>, "regex.h forward-declares pcre2_code");

namespace moecore::data {

Regex::Regex(const std::string& pattern, const std::string& where) {
  int err = 0;
  PCRE2_SIZE off = 0;
  code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), PCRE2_UTF | PCRE2_UCP, &err, &off,
                        nullptr);
  if (!code_) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof(msg));
    MOE_CHECK(false, "{}: regex /{}/ does not compile at offset {}: {}", where, pattern, off,
              reinterpret_cast<char*>(msg));
  }
  pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE);  // without JIT (unsupported CPU), pcre2_match interprets
}

Regex::~Regex() {
  pcre2_code_free(code_);
}

bool Regex::next_match(std::string_view s, size_t& pos, size_t& a, size_t& b) const {
  // Per-thread match data and JIT stack, reused by every pattern.
  struct Tls {
    pcre2_match_data* md = nullptr;
    pcre2_match_context* mc = nullptr;
    pcre2_jit_stack* js = nullptr;
    ~Tls() {
      if (md) pcre2_match_data_free(md);
      if (mc) pcre2_match_context_free(mc);
      if (js) pcre2_jit_stack_free(js);
    }
  };
  thread_local Tls tls;
  if (!tls.md) {
    tls.md = pcre2_match_data_create(16, nullptr);
    tls.mc = pcre2_match_context_create(nullptr);
    tls.js = pcre2_jit_stack_create(64 * 1024, 8 * 1024 * 1024, nullptr);
    pcre2_jit_stack_assign(tls.mc, nullptr, tls.js);
  }
  while (pos <= s.size()) {
    const int rc =
        pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), pos, PCRE2_NO_UTF_CHECK, tls.md, tls.mc);
    if (rc == PCRE2_ERROR_NOMATCH) return false;
    MOE_CHECK(rc >= 0, "tokenizer regex failed with PCRE2 error {} (input too complex?)", rc);
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(tls.md);
    a = ov[0];
    b = ov[1];
    if (b == a) {  // empty match: step over one character
      pos = a + 1;
      while (pos < s.size() && (static_cast<unsigned char>(s[pos]) & 0xC0) == 0x80) pos++;
      continue;
    }
    pos = b;
    return true;
  }
  return false;
}

}  // namespace moecore::data
