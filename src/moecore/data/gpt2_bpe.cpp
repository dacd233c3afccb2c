// GPT-2 vocab.json + merges.txt → tokenizer.json text (see gpt2_bpe.h).
#include "moecore/data/gpt2_bpe.h"

#include <nlohmann/json.hpp>
#include <sstream>

#include "moecore/core/error.h"
#include "moecore/core/file.h"

namespace moecore::data {

using json = nlohmann::json;

std::string gpt2_tokenizer_json(const std::string& vocab_file, const std::string& merge_file) {
  json vocab;
  try {
    vocab = json::parse(read_file(vocab_file, "--vocab-file"));
  } catch (const json::exception& e) {
    MOE_CHECK(false, "--vocab-file {} is not valid JSON: {}", vocab_file, e.what());
  }
  MOE_CHECK(vocab.is_object() && !vocab.empty(),
            "--vocab-file {}: expected GPT-2's vocab.json, an object of token -> id", vocab_file);
  MOE_CHECK(vocab.contains(kGpt2EndOfText), "--vocab-file {} has no {} token (GPT2BPETokenizer's end of document)",
            vocab_file, kGpt2EndOfText);
  std::istringstream lines(read_file(merge_file, "--merge-file"));
  json merges = json::array();
  std::string line;
  for (int64_t n = 1; std::getline(lines, line); n++) {
    if (n == 1) continue;  // "#version: 0.2": skipped whatever it says, as Megatron and HuggingFace do
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    const size_t space = line.find(' ');
    MOE_CHECK(space != std::string::npos && space > 0 && space + 1 < line.size() &&
                  line.find(' ', space + 1) == std::string::npos,
              "--merge-file {} line {}: expected two tokens separated by one space, got '{}'", merge_file, n, line);
    merges.push_back(line);
  }
  json t = {{"version", "1.0"},
            {"added_tokens", json::array()},
            {"normalizer", nullptr},
            {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
            {"decoder", {{"type", "ByteLevel"}}},
            {"model", {{"type", "BPE"}, {"vocab", std::move(vocab)}, {"merges", std::move(merges)}}}};
  return t.dump();
}

}  // namespace moecore::data
