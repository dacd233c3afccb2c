// Applying BPE merges to a word (see bpe_model.h). Quadratic in the word's length: every round rescans all
// adjacent pairs for the lowest rank. Words are short and cached per thread, so this rarely matters.
#include "moecore/data/bpe_model.h"

#include <atomic>
#include <climits>

#include "moecore/core/error.h"

namespace moecore::data {

void MergeTable::build(const std::vector<BpeMerge>& merges) {
  size_t cap = 16;
  while (cap < merges.size() * 2) cap <<= 1;
  keys_.assign(cap, kEmpty);
  vals_.assign(cap, {0, 0});
  mask_ = cap - 1;
  for (size_t rank = 0; rank < merges.size(); rank++) {
    const uint64_t k = key(merges[rank].left, merges[rank].right);
    size_t i = hash(k) & mask_;
    while (keys_[i] != kEmpty && keys_[i] != k) i = (i + 1) & mask_;
    if (keys_[i] == kEmpty) {  // the first (lowest-rank) merge of a pair wins
      keys_[i] = k;
      vals_[i] = {static_cast<int32_t>(rank), merges[rank].merged};
    }
  }
}

const std::pair<int32_t, int32_t>* MergeTable::find(int32_t a, int32_t b) const {
  const uint64_t k = key(a, b);
  size_t i = hash(k) & mask_;
  while (true) {
    if (keys_[i] == k) return &vals_[i];
    if (keys_[i] == kEmpty) return nullptr;
    i = (i + 1) & mask_;
  }
}

namespace {
uint64_t next_serial() {
  static std::atomic<uint64_t> s{1};
  return s++;
}

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
}  // namespace

BpeModel::BpeModel(std::unordered_map<std::string, int32_t> bytes_to_id, bool ignore_merges, const std::string& source)
    : bytes_to_id_(std::move(bytes_to_id)), ignore_merges_(ignore_merges), serial_(next_serial()) {
  for (int b = 0; b < 256; b++) {
    auto it = bytes_to_id_.find(std::string(1, static_cast<char>(b)));
    MOE_CHECK(it != bytes_to_id_.end(), "{}: the vocabulary lacks the byte-level symbol for byte {}", source, b);
    byte_id_[b] = it->second;
  }
  merges_.build({});
}

void BpeModel::set_merges(const std::vector<BpeMerge>& merges) {
  merges_.build(merges);
}

std::optional<int32_t> BpeModel::id_of(const std::string& raw) const {
  auto it = bytes_to_id_.find(raw);
  if (it == bytes_to_id_.end()) return std::nullopt;
  return it->second;
}

void BpeModel::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  // Per-thread cache of whole words: text repeats words constantly.
  struct Cache {
    uint64_t owner = 0;
    std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> map;
  };
  thread_local Cache cache;
  if (cache.owner != serial_) {
    cache.map.clear();
    cache.owner = serial_;
  }
  if (auto it = cache.map.find(word); it != cache.map.end()) {
    out.insert(out.end(), it->second.begin(), it->second.end());
    return;
  }
  std::vector<int32_t> sym;
  if (ignore_merges_) {
    if (auto it = bytes_to_id_.find(std::string(word)); it != bytes_to_id_.end()) sym.push_back(it->second);
  }
  if (sym.empty()) {
    sym.reserve(word.size());
    for (unsigned char c : word) sym.push_back(byte_id_[c]);
    while (sym.size() > 1) {
      int32_t best_rank = INT32_MAX, best_id = -1;
      size_t best_i = 0;
      for (size_t i = 0; i + 1 < sym.size(); i++) {
        const auto* hit = merges_.find(sym[i], sym[i + 1]);
        if (hit && hit->first < best_rank) {
          best_rank = hit->first;
          best_id = hit->second;
          best_i = i;
        }
      }
      if (best_id < 0) break;
      sym[best_i] = best_id;
      sym.erase(sym.begin() + static_cast<std::ptrdiff_t>(best_i) + 1);
    }
  }
  out.insert(out.end(), sym.begin(), sym.end());
  if (cache.map.size() > 200000) cache.map.clear();
  cache.map.emplace(std::string(word), std::move(sym));
}

}  // namespace moecore::data
