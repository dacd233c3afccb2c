// Byte-level BPE training (see bpe_trainer.h): words from the GPT-2 pre-tokenizer pattern, counted; then
// repeatedly merge the most frequent adjacent pair (ties: the pair of lower ids), updating pair counts only in the
// words that contain the pair.
#include "moecore/data/bpe_trainer.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <queue>
#include <unordered_map>
#include <unordered_set>

#include "moecore/core/error.h"
#include "moecore/data/byte_level.h"
#include "moecore/data/regex.h"
#include "moecore/data/text_pipeline.h"
#include "moecore/data/utf8.h"

namespace moecore::data {

using json = nlohmann::json;

namespace {
// The HuggingFace tokenizer.json of a trained vocabulary: `tok_bytes` per id, merges in rank order, then the
// special tokens as added tokens.
std::string tokenizer_json(const std::vector<std::string>& tok_bytes,
                           const std::vector<std::pair<int32_t, int32_t>>& merges,
                           const std::vector<std::string>& special_tokens) {
  const int64_t n_special = static_cast<int64_t>(special_tokens.size());
  json vocab = json::object();
  for (size_t i = 0; i < tok_bytes.size(); i++) vocab[byte_level_spell(tok_bytes[i])] = static_cast<int64_t>(i);
  json jm = json::array();
  for (auto [a, b] : merges)
    jm.push_back(json::array({byte_level_spell(tok_bytes[a]), byte_level_spell(tok_bytes[b])}));
  json added = json::array();
  for (int64_t i = 0; i < n_special; i++)
    added.push_back({{"id", static_cast<int64_t>(tok_bytes.size()) + i},
                     {"content", special_tokens[i]},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
  json j = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", added},
      {"normalizer", {{"type", "NFC"}}},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         json::array(
             {{{"type", "Split"}, {"pattern", {{"Regex", kGpt2Pattern}}}, {"behavior", "Isolated"}, {"invert", false}},
              {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}}})}}},
      {"post_processor", nullptr},
      {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}}},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", nullptr},
        {"continuing_subword_prefix", ""},
        {"end_of_word_suffix", ""},
        {"fuse_unk", false},
        {"byte_fallback", false},
        {"ignore_merges", false},
        {"vocab", vocab},
        {"merges", jm}}}};
  return j.dump();
}
}  // namespace

std::string train_bpe_tokenizer_json(std::string_view corpus, int64_t vocab_size,
                                     const std::vector<std::string>& special_tokens) {
  const int64_t bad = find_invalid_utf8(corpus);
  MOE_CHECK(bad < 0, "training corpus is not valid UTF-8 (byte offset {})", bad);
  const int64_t n_special = static_cast<int64_t>(special_tokens.size());
  MOE_CHECK(vocab_size >= 256 + n_special, "vocabulary size {} is below 256 bytes + {} special tokens", vocab_size,
            n_special);
  Regex re(kGpt2Pattern, "BPE trainer");
  std::unordered_map<std::string, int64_t> word_count;
  re.for_each_match(corpus, [&](size_t a, size_t b) { word_count[std::string(corpus.substr(a, b - a))]++; });
  // Words in a deterministic order (by text).
  std::vector<std::pair<std::string, int64_t>> sorted(word_count.begin(), word_count.end());
  std::sort(sorted.begin(), sorted.end());
  std::vector<std::vector<int32_t>> words;
  std::vector<int64_t> counts;
  for (auto& [w, c] : sorted) {
    std::vector<int32_t> sym;
    for (unsigned char ch : w) sym.push_back(ch);
    words.push_back(std::move(sym));
    counts.push_back(c);
  }
  auto key = [](int32_t a, int32_t b) { return (static_cast<uint64_t>(a) << 32) | static_cast<uint32_t>(b); };
  std::unordered_map<uint64_t, int64_t> pair_count;
  std::unordered_map<uint64_t, std::unordered_set<int32_t>> where;
  for (size_t w = 0; w < words.size(); w++)
    for (size_t i = 0; i + 1 < words[w].size(); i++) {
      const uint64_t k = key(words[w][i], words[w][i + 1]);
      pair_count[k] += counts[w];
      where[k].insert(static_cast<int32_t>(w));
    }
  // Max-heap of (count, -key) with lazy invalidation.
  using Item = std::pair<int64_t, int64_t>;
  std::priority_queue<Item> heap;
  for (auto& [k, c] : pair_count) heap.push({c, -static_cast<int64_t>(k)});
  std::vector<std::string> tok_bytes;
  for (int b = 0; b < 256; b++) tok_bytes.push_back(std::string(1, static_cast<char>(b)));
  std::vector<std::pair<int32_t, int32_t>> merges;
  const int64_t target = vocab_size - n_special;
  while (static_cast<int64_t>(tok_bytes.size()) < target && !heap.empty()) {
    auto [c, nk] = heap.top();
    heap.pop();
    const uint64_t k = static_cast<uint64_t>(-nk);
    auto pc = pair_count.find(k);
    if (pc == pair_count.end() || pc->second != c || c <= 0) continue;  // stale
    const int32_t a = static_cast<int32_t>(k >> 32), b = static_cast<int32_t>(k & 0xffffffffu);
    const int32_t nid = static_cast<int32_t>(tok_bytes.size());
    tok_bytes.push_back(tok_bytes[a] + tok_bytes[b]);
    merges.emplace_back(a, b);
    std::vector<int32_t> ws(where[k].begin(), where[k].end());
    std::sort(ws.begin(), ws.end());
    std::unordered_map<uint64_t, int64_t> delta;
    for (int32_t w : ws) {
      auto& sym = words[w];
      const int64_t wc = counts[w];
      bool changed = false;
      for (size_t i = 0; i + 1 < sym.size(); i++)
        if (sym[i] == a && sym[i + 1] == b) changed = true;
      if (!changed) continue;
      for (size_t i = 0; i + 1 < sym.size(); i++) delta[key(sym[i], sym[i + 1])] -= wc;
      std::vector<int32_t> out;
      for (size_t i = 0; i < sym.size(); i++) {
        if (i + 1 < sym.size() && sym[i] == a && sym[i + 1] == b) {
          out.push_back(nid);
          i++;
        } else {
          out.push_back(sym[i]);
        }
      }
      sym = std::move(out);
      for (size_t i = 0; i + 1 < sym.size(); i++) {
        const uint64_t nk2 = key(sym[i], sym[i + 1]);
        delta[nk2] += wc;
        where[nk2].insert(w);
      }
    }
    for (auto& [dk, dv] : delta) {
      if (dv == 0) continue;
      int64_t& v = pair_count[dk];
      v += dv;
      if (v > 0) heap.push({v, -static_cast<int64_t>(dk)});
    }
    pair_count.erase(k);
    where.erase(k);
  }
  return tokenizer_json(tok_bytes, merges, special_tokens);
}

}  // namespace moecore::data
