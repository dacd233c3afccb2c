// libFuzzer target: the tokenizer.json loader, then an encode/decode round trip on whatever loads. A
// moecore::Error is the expected answer to garbage; anything else is a bug.
#include <cstdint>
#include <string>

#include "moecore/core/error.h"
#include "moecore/data/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const auto tok =
        moecore::data::Tokenizer::from_json(std::string(reinterpret_cast<const char*>(data), size), "fuzz");
    const std::string text = "Hello, w\xC3\xB6rld! 123 \xE4\xBD\xA0\xE5\xA5\xBD <|endoftext|>";
    const auto ids = tok.encode(text);
    (void)tok.decode(ids);
  } catch (const moecore::Error&) {
  }
  return 0;
}
