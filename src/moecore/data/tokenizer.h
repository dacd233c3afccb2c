// HuggingFace tokenizer.json for byte-level BPE models (Qwen, DeepSeek, Llama-3, Mixtral-style GPT-2 BPE):
// added/special tokens split out first, then normalizer (NFC, NFD, NFKC, NFKD, Lowercase, Replace, Prepend,
// Strip, Sequence), pre-tokenizer (Split with a PCRE2 regex or string, ByteLevel, Digits, Sequence), BPE merges
// by rank, and ByteLevel decoding. Token ids equal HuggingFace's encode(text, add_special_tokens=False).
// Not here: SentencePiece-style BPE (Metaspace, byte fallback), WordPiece, Unigram: rejected with the model type.
// Files: text_pipeline (normalizers, pre-tokenizers), bpe_model (merges), byte_level (the byte alphabet),
// bpe_trainer (training a vocabulary); this file holds the public class and tokenizer.json loading.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "moecore/data/utf8.h"  // find_invalid_utf8, which encode applies

namespace moecore::data {

class Tokenizer {
 public:
  // Loads tokenizer.json; reads tokenizer_config.json from the same directory when present (EOS/BOS names).
  static Tokenizer from_file(const std::string& path);
  // Loads from JSON text (`source` names it in errors).
  static Tokenizer from_json(const std::string& json_text, const std::string& source);
  // Megatron's GPT2BPETokenizer: GPT-2's vocab.json and merges.txt (gpt2_bpe.h); EOS is <|endoftext|>.
  static Tokenizer from_gpt2_files(const std::string& vocab_file, const std::string& merge_file);

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
  // The tokenizer.json text it was loaded from (a checkpoint carries it, with the EOS token's name).
  const std::string& json_text() const;

 private:
  Tokenizer();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace moecore::data
