// The BPE model of a byte-level tokenizer: vocabulary ids of raw byte strings and merge ranks, and applying the
// merges to one word (lowest rank first, leftmost first: HuggingFace's order) in O(n log n) of its length. Not JSON
// parsing (tokenizer.cpp), not pre-tokenization (text_pipeline.h), not training (bpe_trainer.h).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace moecore::data {

// One merge: the pair (left, right) of ids becomes `merged`. A merge's rank is its position in the list.
struct BpeMerge {
  int32_t left, right, merged;
};

// Open-addressing map from a merge pair (a, b) to (rank, merged id): one cache line per probe, where a node-based
// map costs a pointer chase; BPE asks it for every adjacent pair of every new word.
class MergeTable {
 public:
  void build(const std::vector<BpeMerge>& merges);
  const std::pair<int32_t, int32_t>* find(int32_t a, int32_t b) const;

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};
  static uint64_t key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  static size_t hash(uint64_t k) { return static_cast<size_t>((k * 0x9E3779B97F4A7C15ull) >> 17); }
  std::vector<uint64_t> keys_;
  std::vector<std::pair<int32_t, int32_t>> vals_;
  size_t mask_ = 0;
};

class BpeModel {
 public:
  // `bytes_to_id`: raw bytes of every vocabulary token -> id; it must hold each of the 256 single bytes (a user
  // error naming `source` otherwise). With `ignore_merges`, a word that is a vocabulary token is that token.
  BpeModel(std::unordered_map<std::string, int32_t> bytes_to_id, bool ignore_merges, const std::string& source);
  // Sets the merges, in rank order.
  void set_merges(const std::vector<BpeMerge>& merges);

  // Appends the ids of `word` (raw bytes, non-empty) to `out`. Thread-safe; caches words per thread.
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;
  // The id of a vocabulary token given as raw bytes.
  std::optional<int32_t> id_of(const std::string& raw) const;

 private:
  // The merges applied to the bytes of `word` (non-empty), ids into `sym`.
  void merge_all(std::string_view word, std::vector<int32_t>& sym) const;
  std::unordered_map<std::string, int32_t> bytes_to_id_;
  int32_t byte_id_[256];
  MergeTable merges_;
  bool ignore_merges_ = false;
  uint64_t serial_ = 0;  // tells this model's word cache from another's on the same thread
};

}  // namespace moecore::data
