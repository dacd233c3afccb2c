// `moecore preprocess`: JSONL → Megatron .bin/.idx, the job of Megatron-LM's tools/preprocess_data.py with the
// same flags and byte-identical output: one document per line and key, each non-empty text tokenized without
// special tokens, the EOS id appended to non-empty documents with --append-eod, uint16 tokens below 65500 vocab.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "moecore/data/tokenizer.h"

namespace moecore::data {

struct PreprocessOptions {
  std::string input;  // JSONL file
  std::vector<std::string> json_keys{"text"};
  std::string output_prefix;                            // writes {prefix}_{key}_document.bin/.idx
  std::string tokenizer_type = "HuggingFaceTokenizer";  // or GPT2BPETokenizer
  std::string tokenizer_model;                          // HuggingFaceTokenizer: tokenizer.json, or its directory
  std::string vocab_file, merge_file;                   // GPT2BPETokenizer: vocab.json and merges.txt
  bool append_eod = false;
  int workers = 1;
  int64_t log_interval = 1000;  // documents between progress lines when not on a terminal
};

struct PreprocessStats {
  int64_t documents = 0;
  int64_t tokens = 0;
  int64_t bytes = 0;
  double seconds = 0;
};

// Runs the conversion; `progress` (may be empty) receives (documents, bytes read, total bytes) as it goes.
PreprocessStats preprocess(const PreprocessOptions& opt,
                           const std::function<void(int64_t, int64_t, int64_t)>& progress = {});

// The tokenizer.json path for --tokenizer-model (a file, or a directory containing tokenizer.json).
std::string resolve_tokenizer_json(const std::string& tokenizer_model);

// The tokenizer Megatron's flags name: HuggingFaceTokenizer with --tokenizer-model, or GPT2BPETokenizer with
// --vocab-file and --merge-file.
Tokenizer load_tokenizer(const std::string& type, const std::string& model, const std::string& vocab_file,
                         const std::string& merge_file);

}  // namespace moecore::data
