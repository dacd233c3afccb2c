// Applying BPE merges to a word (see bpe_model.h) in O(n log n) of the word's length n, as HuggingFace's
// Word::merge_all does: symbols in a linked list, a min-heap of merge candidates (rank, position of the left
// symbol). A word the pre-tokenizer cannot split (a megabyte of letters) must not cost n^2.
#include "moecore/data/bpe_model.h"

#include <algorithm>
#include <atomic>
#include <limits>

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

namespace {
// A symbol of the word being merged: its id and its neighbours (indices into the symbol array, -1 at an end).
// A symbol absorbed into its left neighbour is dead: next == kDead.
struct Symbol {
  int32_t id, prev, next;
};
constexpr int32_t kDead = -2;
// A possible merge of the symbol at `pos` with its right neighbour. Candidates are never removed when a merge
// changes their symbols; a popped candidate is checked against the symbols as they are now (stale: skipped).
struct Candidate {
  int32_t rank, pos;
};
// std::push_heap keeps the "largest" on top: the lowest rank, then the leftmost position, is the largest here.
bool later(const Candidate& a, const Candidate& b) {
  return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
}
}  // namespace

// The merges in the order of the reference algorithm (repeat: merge the lowest-rank adjacent pair, the leftmost
// of equals). Equal because the heap holds every adjacent pair that has a merge (each pair formed is pushed), a
// popped candidate is applied only if the pair now at `pos` still has exactly that rank (ranks name pairs), and
// positions grow left to right along the list. At most n - 1 + 2 * merges <= 3n candidates: O(n log n).
void BpeModel::merge_all(std::string_view word, std::vector<int32_t>& sym) const {
  thread_local std::vector<Symbol> syms;
  thread_local std::vector<Candidate> heap;
  MOE_CHECK(word.size() < static_cast<size_t>(std::numeric_limits<int32_t>::max()),
            "a pre-tokenized word of {} bytes: words must stay below 2 GiB", word.size());
  const auto n = static_cast<int32_t>(word.size());
  syms.resize(word.size());
  heap.clear();
  for (int32_t i = 0; i < n; i++)
    syms[static_cast<size_t>(i)] = {byte_id_[static_cast<unsigned char>(word[static_cast<size_t>(i)])], i - 1,
                                    i + 1 < n ? i + 1 : -1};
  auto push_pair = [&](int32_t pos) {
    const Symbol& l = syms[static_cast<size_t>(pos)];
    if (const auto* hit = merges_.find(l.id, syms[static_cast<size_t>(l.next)].id)) {
      heap.push_back({hit->first, pos});
      std::push_heap(heap.begin(), heap.end(), later);
    }
  };
  for (int32_t i = 0; i + 1 < n; i++) push_pair(i);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), later);
    const Candidate c = heap.back();
    heap.pop_back();
    Symbol& l = syms[static_cast<size_t>(c.pos)];
    if (l.next < 0) continue;  // dead, or now the last symbol
    Symbol& r = syms[static_cast<size_t>(l.next)];
    const auto* hit = merges_.find(l.id, r.id);
    if (!hit || hit->first != c.rank) continue;  // stale: a neighbour changed since the candidate was pushed
    l.id = hit->second;
    l.next = r.next;
    r.next = kDead;
    if (l.next >= 0) syms[static_cast<size_t>(l.next)].prev = c.pos;
    if (l.prev >= 0) push_pair(l.prev);
    if (l.next >= 0) push_pair(c.pos);
  }
  sym.clear();
  for (int32_t i = 0; i >= 0; i = syms[static_cast<size_t>(i)].next) sym.push_back(syms[static_cast<size_t>(i)].id);
  if (syms.capacity() > (size_t{1} << 16)) {  // a huge word: do not keep its scratch for the thread's lifetime
    syms = {};
    heap = {};
  }
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
  if (sym.empty()) merge_all(word, sym);
  out.insert(out.end(), sym.begin(), sym.end());
  if (cache.map.size() > 200000) cache.map.clear();
  cache.map.emplace(std::string(word), std::move(sym));
}

}  // namespace moecore::data
