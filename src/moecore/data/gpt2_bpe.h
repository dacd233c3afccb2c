// Megatron's GPT2BPETokenizer files (--vocab-file vocab.json, --merge-file merges.txt) as the tokenizer.json text
// the Tokenizer loads: byte-level BPE with GPT-2's pre-tokenizer regex and byte-level decoding. As Megatron's (and
// HuggingFace's slow GPT2Tokenizer), the first line of merges.txt (the "#version" header) is skipped, and no
// special tokens are recognized in text; its end-of-document token is <|endoftext|>.
#pragma once

#include <string>

namespace moecore::data {

inline constexpr const char* kGpt2EndOfText = "<|endoftext|>";

// The tokenizer.json text for GPT-2 files; errors name the file and the line.
std::string gpt2_tokenizer_json(const std::string& vocab_file, const std::string& merge_file);

}  // namespace moecore::data
