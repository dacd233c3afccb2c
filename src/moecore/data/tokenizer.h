// HuggingFace tokenizer.json for byte-level BPE models (Qwen, DeepSeek, Llama-3, Mixtral-style GPT-2 BPE):
// added/special tokens split out first, then normalizer (NFC, NFD, NFKC, NFKD, Lowercase, Replace, Prepend,
// Strip, Sequence), pre-tokenizer (Split with a PCRE2 regex or string, ByteLevel, Digits, Sequence), BPE merges
// by rank, and ByteLevel decoding. Token ids equal HuggingFace's encode(text, add_special_tokens=False).
// Not here: SentencePiece-style BPE (Metaspace, byte fallback), WordPiece, Unigram: rejected with the model type.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace moecore::data {

class Tokenizer {
 public:
  // Loads tokenizer.json; reads tokenizer_config.json from the same directory when present (EOS/BOS names).
  static Tokenizer from_file(const std::string& path);
  // Loads from JSON text (`source` names it in errors).
  static Tokenizer from_json(const std::string& json_text, const std::string& source);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // Text (valid UTF-8, else a user error naming the byte offset) -> ids. No special tokens are added; special
  // tokens written in the text are recognized.
  std::vector<int32_t> encode(std::string_view text) const;
  // Ids -> text (special tokens included as their text).
  std::string decode(const std::vector<int32_t>& ids) const;

  // len(tokenizer) in HuggingFace terms: ids in the vocabulary plus added tokens.
  int64_t vocab_size() const;
  std::optional<int32_t> token_to_id(const std::string& token) const;
  // EOS token id (tokenizer_config.json eos_token), used as Megatron's eod. nullopt when not configured.
  std::optional<int32_t> eos_id() const;
  const std::string& source() const;

 private:
  Tokenizer();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Checks that `text` is valid UTF-8; returns the byte offset of the first invalid sequence, or -1.
int64_t find_invalid_utf8(std::string_view text);

// Trains a byte-level BPE vocabulary of `vocab_size` tokens (256 byte symbols + merges + the special tokens) on
// `corpus`, pre-tokenized with the GPT-2 pattern, and returns a tokenizer.json document (HF format) that
// Tokenizer::from_json loads. Special tokens are added at the end of the vocabulary; the first is the EOS.
std::string train_bpe_tokenizer_json(std::string_view corpus, int64_t vocab_size,
                                     const std::vector<std::string>& special_tokens);

}  // namespace moecore::data
