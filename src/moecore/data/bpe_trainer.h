// Training a byte-level BPE vocabulary from a corpus, written as a HuggingFace tokenizer.json that
// Tokenizer::from_json loads. Not encoding (tokenizer.h) and not a general trainer (no other model types).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace moecore::data {

// Trains a byte-level BPE vocabulary of `vocab_size` tokens (256 byte symbols + merges + the special tokens) on
// `corpus`, pre-tokenized with the GPT-2 pattern, and returns a tokenizer.json document (HF format) that
// Tokenizer::from_json loads. Special tokens are added at the end of the vocabulary; the first is the EOS.
std::string train_bpe_tokenizer_json(std::string_view corpus, int64_t vocab_size,
                                     const std::vector<std::string>& special_tokens);

}  // namespace moecore::data
