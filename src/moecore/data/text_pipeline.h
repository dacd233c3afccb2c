// The text side of a HuggingFace tokenizer.json: normalizer (NFC, NFD, NFKC, NFKD, Lowercase, Replace, Prepend,
// Strip, Sequence) and pre-tokenizer (Split, ByteLevel, Digits, Sequence), turning text into the words BPE sees.
// Not the BPE model (bpe_model.h) and not added-token splitting (tokenizer.cpp).
#pragma once

#include <deque>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "moecore/data/regex.h"

namespace moecore::data {

// GPT-2's pre-tokenizer pattern: the ByteLevel pre-tokenizer's (use_regex) and the BPE trainer's.
inline constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

struct Normalizer {
  enum Kind { NFC, NFD, NFKC, NFKD, Lowercase, ReplaceString, ReplaceRegex, Prepend, Strip, Sequence };
  Kind kind = Sequence;
  std::string a, b;  // Replace: pattern, content; Prepend: text
  bool left = true, right = true;
  std::unique_ptr<Regex> re;
  std::vector<Normalizer> children;

  // True when the normalizer leaves pure-ASCII text unchanged (Unicode normal forms), so ASCII can skip it.
  bool identity_on_ascii() const;
  std::string apply(std::string s) const;
};

enum class SplitBehavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

struct PreTokenizer {
  enum Kind { Split, ByteLevel, Sequence };
  Kind kind = Sequence;
  std::unique_ptr<Regex> re;
  SplitBehavior behavior = SplitBehavior::Isolated;
  bool invert = false;
  bool add_prefix_space = false;
  std::vector<PreTokenizer> children;

  // Splits pieces in place. A piece is a view into the normalized text or, once a prefix space was added, into a
  // string owned by `owned`.
  void apply(std::vector<std::string_view>& pieces, std::deque<std::string>& owned) const;
  // Splits one piece by `re` and `behavior`, appending to `out`.
  void split(std::string_view s, std::vector<std::string_view>& out) const;
};

// Normalizer then pre-tokenizer, as tokenizer.json's "normalizer" and "pre_tokenizer" sections describe them.
struct TextPipeline {
  Normalizer normalizer;
  PreTokenizer pre;
  bool ascii_fast = false;  // normalizer is the identity on ASCII text
  bool byte_level = false;  // a ByteLevel pre-tokenizer is present

  // Parses the two sections (null: none); `src` names the file in errors.
  static TextPipeline from_json(const nlohmann::json& normalizer, const nlohmann::json& pre_tokenizer,
                                const std::string& src);

  // The words of `text` (no added tokens in it), as views into `text`, `normalized` or `owned`.
  void words(std::string_view text, std::string& normalized, std::deque<std::string>& owned,
             std::vector<std::string_view>& out) const;
};

}  // namespace moecore::data
