// BpeModel::encode_word (heap over a linked list, O(n log n)) gives exactly the ids of the straightforward
// quadratic algorithm it replaced (kept here as the reference) on random words and merge tables and on the
// adversarial cases for a heap (long runs of one byte, repeated pairs, overlapping merges of equal rank), and a
// word of a megabyte without a split point encodes in about a second where the old algorithm took hours.
#include <gtest/gtest.h>

#include <chrono>
#include <climits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "moecore/data/bpe_model.h"

namespace moecore {
namespace {

using data::BpeMerge;

// The textbook BPE encoder as a reference, written for clarity: while any adjacent pair has a merge,
// merge the pair of lowest rank, the leftmost of equals. O(n^2) in the word length.
std::vector<int32_t> reference_encode(const std::vector<BpeMerge>& merges, const std::string& word) {
  std::map<std::pair<int32_t, int32_t>, std::pair<int32_t, int32_t>> table;  // pair -> (rank, merged); first wins
  for (size_t r = 0; r < merges.size(); r++)
    table.emplace(std::make_pair(merges[r].left, merges[r].right),
                  std::make_pair(static_cast<int32_t>(r), merges[r].merged));
  std::vector<int32_t> sym;
  for (unsigned char c : word) sym.push_back(c);  // byte b has id b in these tests
  while (sym.size() > 1) {
    int32_t best_rank = INT32_MAX, best_id = -1;
    size_t best_i = 0;
    for (size_t i = 0; i + 1 < sym.size(); i++) {
      auto it = table.find({sym[i], sym[i + 1]});
      if (it != table.end() && it->second.first < best_rank) {
        best_rank = it->second.first;
        best_id = it->second.second;
        best_i = i;
      }
    }
    if (best_id < 0) break;
    sym[best_i] = best_id;
    sym.erase(sym.begin() + static_cast<std::ptrdiff_t>(best_i) + 1);
  }
  return sym;
}

data::BpeModel make_model(const std::vector<BpeMerge>& merges) {
  std::unordered_map<std::string, int32_t> vocab;
  for (int b = 0; b < 256; b++) vocab[std::string(1, static_cast<char>(b))] = b;
  data::BpeModel m(std::move(vocab), false, "test");
  m.set_merges(merges);
  return m;
}

std::vector<int32_t> encode(const data::BpeModel& m, const std::string& word) {
  std::vector<int32_t> out;
  m.encode_word(word, out);
  return out;
}

// Random merges over the letters a..d and the tokens merged so far (ids 256, 257, ...), duplicates of an earlier
// pair included (the first rank must win).
std::vector<BpeMerge> random_merges(std::mt19937& rng, int count) {
  std::vector<int32_t> tokens = {'a', 'b', 'c', 'd'};
  std::vector<BpeMerge> merges;
  for (int k = 0; k < count; k++) {
    if (!merges.empty() && rng() % 8 == 0) {  // a duplicate pair with another result
      BpeMerge dup = merges[rng() % merges.size()];
      dup.merged = 256 + k;
      merges.push_back(dup);
    } else {
      merges.push_back({tokens[rng() % tokens.size()], tokens[rng() % tokens.size()], 256 + k});
    }
    tokens.push_back(256 + k);
  }
  return merges;
}

TEST(BpeModel, HeapMergesEqualQuadraticReferenceOnRandomWords) {
  std::mt19937 rng(1234);
  int compared = 0;
  for (int table = 0; table < 30; table++) {
    const std::vector<BpeMerge> merges = random_merges(rng, 1 + static_cast<int>(rng() % 60));
    const data::BpeModel model = make_model(merges);
    for (int w = 0; w < 60; w++) {
      std::string word(1 + rng() % 300, 'a');
      const int letters = 1 + static_cast<int>(rng() % 4);  // few letters: many merges fire, many ties
      for (char& c : word) c = static_cast<char>('a' + rng() % static_cast<unsigned>(letters));
      ASSERT_EQ(encode(model, word), reference_encode(merges, word)) << "table " << table << " word " << word;
      compared++;
    }
  }
  EXPECT_EQ(compared, 1800);
}

TEST(BpeModel, HeapMergesEqualQuadraticReferenceOnAdversarialWords) {
  const int32_t a = 'a', b = 'b', c = 'c';
  const std::vector<std::vector<BpeMerge>> tables = {
      {{a, a, 256}},                                    // runs of one byte: ties at every position
      {{a, a, 256}, {256, 256, 257}, {257, 257, 258}},  // doubling: a run collapses level by level
      {{256, a, 258}, {a, a, 256}, {a, 256, 257}},      // a merged token then merges on either side
      {{a, b, 256}, {b, a, 257}, {256, 256, 258}},      // "abab": overlapping pairs of different rank
      {{b, a, 256}, {a, b, 257}, {257, 257, 258}, {256, b, 259}},
      {{a, b, 256}, {256, c, 257}, {c, a, 258}, {258, b, 259}, {257, 259, 260}},
  };
  std::vector<std::string> words;
  for (int n : {1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 500, 1001, 2048}) {
    words.push_back(std::string(static_cast<size_t>(n), 'a'));
    std::string ab, aab, abc;
    for (int i = 0; i < n; i++) {
      ab += "ab";
      aab += "aab";
      abc += "abc";
    }
    words.push_back(ab);
    words.push_back("b" + ab);
    words.push_back(aab);
    words.push_back(abc);
    words.push_back(std::string(static_cast<size_t>(n), 'a') + "b" + std::string(static_cast<size_t>(n), 'a'));
  }
  for (size_t t = 0; t < tables.size(); t++) {
    const data::BpeModel model = make_model(tables[t]);
    for (const std::string& w : words)
      ASSERT_EQ(encode(model, w), reference_encode(tables[t], w)) << "table " << t << " word of " << w.size();
  }
}

TEST(BpeModel, MegabyteWordWithoutSplitIsFast) {
  // Ten doubling merges: 2^20 'a' become 1024 tokens of 1024 'a' each. The quadratic encoder rescanned the whole
  // word after each of its ~10^6 merges (hours); the heap does ~3 * 10^6 heap operations.
  std::vector<BpeMerge> merges = {{'a', 'a', 256}};
  for (int k = 1; k < 10; k++) merges.push_back({255 + k, 255 + k, 256 + k});
  const data::BpeModel model = make_model(merges);
  const std::string word(size_t{1} << 20, 'a');
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<int32_t> ids = encode(model, word);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(ids, std::vector<int32_t>(1024, 265));
  EXPECT_LT(seconds, 30.0) << "1 MiB word without a split point (the quadratic encoder: hours)";
}

}  // namespace
}  // namespace moecore
