// HuggingFace tokenizer.json loading and the encode/decode plumbing around the text pipeline and the BPE model
// (see tokenizer.h): added tokens split out first, words from the text pipeline, ids from the BPE model. Vocabulary
// tokens are held as raw bytes; the byte-level spelling is undone once, at load.
#include "moecore/data/tokenizer.h"

#include <algorithm>
#include <cctype>
#include <deque>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "moecore/core/error.h"
#include "moecore/core/file.h"
#include "moecore/data/bpe_model.h"
#include "moecore/data/byte_level.h"
#include "moecore/data/gpt2_bpe.h"
#include "moecore/data/text_pipeline.h"

namespace moecore::data {

using json = nlohmann::json;

namespace {

struct AddedToken {
  std::string content;
  int32_t id;
  bool special, lstrip, rstrip;
};

std::string token_name(const json& j) {
  if (j.is_string()) return j.get<std::string>();
  if (j.is_object() && j.contains("content")) return j["content"].get<std::string>();
  return "";
}

// The BPE model options moecore implements; anything else is rejected by name.
void check_bpe_options(const json& model, const std::string& src) {
  const std::string type = model.value("type", "");
  MOE_CHECK(type == "BPE",
            "{}: model type '{}' is not supported; moecore reads byte-level BPE tokenizers (Qwen, DeepSeek, "
            "Llama-3, GPT-2 style)",
            src, type.empty() ? "(missing)" : type);
  MOE_CHECK(model.value("dropout", json()).is_null() || model["dropout"].get<double>() == 0.0,
            "{}: BPE dropout is not supported", src);
  MOE_CHECK(!model.value("byte_fallback", false), "{}: BPE with byte_fallback (SentencePiece style) is not supported",
            src);
  for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const json v = model.value(k, json());
    MOE_CHECK(v.is_null() || v.get<std::string>().empty(), "{}: BPE {} is not supported", src, k);
  }
}

// Merges: "a b" strings or ["a", "b"] pairs of vocabulary tokens, rank = position.
std::vector<BpeMerge> parse_merges(const json& merges, const json& vocab, const std::string& src) {
  std::vector<BpeMerge> out;
  out.reserve(merges.size());
  int32_t rank = 0;
  for (const auto& mg : merges) {
    std::string a, b;
    if (mg.is_string()) {
      const std::string s = mg.get<std::string>();
      const size_t sp = s.find(' ', 1);
      MOE_CHECK(sp != std::string::npos, "{}: merge {} '{}' is not two space-separated tokens", src, rank, s);
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else {
      MOE_CHECK(mg.is_array() && mg.size() == 2, "{}: merge {} is not a pair", src, rank);
      a = mg[0].get<std::string>();
      b = mg[1].get<std::string>();
    }
    auto ia = vocab.find(a), ib = vocab.find(b), iab = vocab.find(a + b);
    MOE_CHECK(ia != vocab.end() && ib != vocab.end() && iab != vocab.end(),
              "{}: merge {} ('{}' + '{}') refers to a token missing from the vocabulary", src, rank, a, b);
    out.push_back({ia.value().get<int32_t>(), ib.value().get<int32_t>(), iab.value().get<int32_t>()});
    rank++;
  }
  return out;
}

}  // namespace

struct Tokenizer::Impl {
  std::string source;
  TextPipeline text;
  std::optional<BpeModel> model;
  std::vector<std::string> id_to_bytes;                       // raw bytes (or added-token text) per id
  std::vector<AddedToken> added;                              // longest first
  std::vector<std::vector<const AddedToken*>> added_by_byte;  // [first byte] -> candidates, longest first
  int64_t vocab_size = 0;
  std::optional<int32_t> eos;
  std::string json_text;

  void encode_text(std::string_view text, std::vector<int32_t>& out) const;
};

void Tokenizer::Impl::encode_text(std::string_view t, std::vector<int32_t>& out) const {
  if (t.empty()) return;
  std::string normalized;
  std::deque<std::string> owned;  // stable addresses: words view into it
  std::vector<std::string_view> words;
  text.words(t, normalized, owned, words);
  for (std::string_view w : words)
    if (!w.empty()) model->encode_word(w, out);
}

Tokenizer::Tokenizer() : impl_(std::make_unique<Impl>()) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Tokenizer Tokenizer::from_file(const std::string& path) {
  Tokenizer t = from_json(read_file(path, "tokenizer file"), path);
  const auto cfg = std::filesystem::path(path).parent_path() / "tokenizer_config.json";
  if (std::filesystem::exists(cfg)) {
    json c;
    try {
      c = json::parse(read_file(cfg.string(), "tokenizer config"));
    } catch (const json::exception& e) {
      MOE_CHECK(false, "{} is not valid JSON: {}", cfg.string(), e.what());
    }
    const std::string eos = c.contains("eos_token") ? token_name(c["eos_token"]) : "";
    if (!eos.empty()) {
      t.impl_->eos = t.token_to_id(eos);
      MOE_CHECK(t.impl_->eos.has_value(), "{}: eos_token '{}' is not in the vocabulary of {}", cfg.string(), eos, path);
    }
  }
  return t;
}

Tokenizer Tokenizer::from_gpt2_files(const std::string& vocab_file, const std::string& merge_file) {
  Tokenizer t = from_json(gpt2_tokenizer_json(vocab_file, merge_file), vocab_file + " with " + merge_file);
  t.impl_->eos = t.token_to_id(kGpt2EndOfText);
  return t;
}

Tokenizer Tokenizer::from_json(const std::string& text, const std::string& src) {
  Tokenizer t;
  Impl& m = *t.impl_;
  m.source = src;
  m.json_text = text;
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    MOE_CHECK(false, "{} is not valid JSON: {}", src, e.what());
  }
  try {
    MOE_CHECK(j.is_object() && j.contains("model"), "{} has no \"model\" section; is it a HuggingFace tokenizer.json?",
              src);
    const json& model = j["model"];
    check_bpe_options(model, src);
    m.text = TextPipeline::from_json(j.value("normalizer", json()), j.value("pre_tokenizer", json()), src);
    MOE_CHECK(m.text.byte_level, "{}: no ByteLevel pre-tokenizer; only byte-level BPE tokenizers are supported", src);
    // Vocabulary: byte-level strings -> raw bytes.
    const json& vocab = model.at("vocab");
    MOE_CHECK(vocab.is_object() && !vocab.empty(), "{}: model.vocab must be a non-empty object", src);
    // Ids index dense tables: bound them by the token count so a corrupt file cannot demand gigabytes.
    const int64_t id_bound =
        2 * static_cast<int64_t>(vocab.size() + j.value("added_tokens", json::array()).size()) + 1024;
    int32_t max_id = -1;
    for (auto it = vocab.begin(); it != vocab.end(); ++it) {
      // Checked first: get<int64_t>() casts a float, undefined beyond int64's range (found by fuzz_tokenizer_json).
      MOE_CHECK(it.value().is_number_integer(), "{}: token '{}' has id {}, not an integer", src, it.key(),
                it.value().dump());
      const int64_t id = it.value().get<int64_t>();
      MOE_CHECK(id >= 0 && id < id_bound, "{}: token '{}' has id {}, outside [0, {}) for a vocabulary of {} tokens",
                src, it.key(), id, id_bound, vocab.size());
      max_id = std::max(max_id, static_cast<int32_t>(id));
    }
    m.id_to_bytes.assign(static_cast<size_t>(max_id) + 1, std::string());
    std::vector<bool> present(static_cast<size_t>(max_id) + 1, false);
    std::unordered_map<std::string, int32_t> bytes_to_id;  // raw bytes of a vocabulary token -> id
    for (auto it = vocab.begin(); it != vocab.end(); ++it) {
      const std::string& tok = it.key();
      const int32_t id = it.value().get<int32_t>();
      MOE_CHECK(id >= 0, "{}: negative id {} for token '{}'", src, id, tok);
      const std::optional<std::string> raw = byte_level_unspell(tok);
      // Tokens outside the byte alphabet (special tokens listed in the vocabulary) keep their text.
      m.id_to_bytes[id] = raw ? *raw : tok;
      present[id] = true;
      if (raw) bytes_to_id.emplace(*raw, id);
    }
    m.model.emplace(std::move(bytes_to_id), model.value("ignore_merges", false), src);
    m.model->set_merges(parse_merges(model.at("merges"), vocab, src));
    // Added tokens.
    for (const auto& a : j.value("added_tokens", json::array())) {
      MOE_CHECK(a.at("id").is_number_integer(), "{}: added token id {} is not an integer", src, a.at("id").dump());
      AddedToken at{a.at("content").get<std::string>(), a.at("id").get<int32_t>(), a.value("special", false),
                    a.value("lstrip", false), a.value("rstrip", false)};
      MOE_CHECK(at.id >= 0 && at.id < id_bound && !at.content.empty(), "{}: invalid added token (id {})", src, at.id);
      if (at.id >= static_cast<int32_t>(m.id_to_bytes.size())) {
        m.id_to_bytes.resize(static_cast<size_t>(at.id) + 1);
        present.resize(static_cast<size_t>(at.id) + 1, false);
      }
      m.id_to_bytes[at.id] = at.content;
      present[at.id] = true;
      m.added.push_back(at);
    }
    std::stable_sort(m.added.begin(), m.added.end(),
                     [](const AddedToken& x, const AddedToken& y) { return x.content.size() > y.content.size(); });
    m.added_by_byte.assign(256, {});
    for (const auto& a : m.added) m.added_by_byte[static_cast<unsigned char>(a.content[0])].push_back(&a);
    m.vocab_size = std::count(present.begin(), present.end(), true);
  } catch (const json::exception& e) {
    MOE_CHECK(false, "{}: malformed tokenizer.json: {}", src, e.what());
  }
  return t;
}

std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
  const int64_t bad = find_invalid_utf8(text);
  MOE_CHECK(bad < 0, "text is not valid UTF-8 (invalid byte sequence at byte offset {})", bad);
  const Impl& m = *impl_;
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 1);
  // Split out added tokens, leftmost first, longest at a position (as HuggingFace and transformers.js do).
  size_t seg_begin = 0, pos = 0;
  while (pos < text.size()) {
    const AddedToken* hit = nullptr;
    for (const AddedToken* a : m.added_by_byte[static_cast<unsigned char>(text[pos])])
      if (text.compare(pos, a->content.size(), a->content) == 0) {
        hit = a;
        break;
      }
    if (!hit) {
      pos++;
      continue;
    }
    size_t left = pos, right = pos + hit->content.size();
    if (hit->lstrip)
      while (left > seg_begin && std::isspace(static_cast<unsigned char>(text[left - 1]))) left--;
    if (hit->rstrip)
      while (right < text.size() && std::isspace(static_cast<unsigned char>(text[right]))) right++;
    m.encode_text(text.substr(seg_begin, left - seg_begin), out);
    out.push_back(hit->id);
    seg_begin = pos = right;
  }
  m.encode_text(text.substr(seg_begin), out);
  return out;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string s;
  for (int32_t id : ids) {
    MOE_CHECK(id >= 0 && id < static_cast<int32_t>(impl_->id_to_bytes.size()), "token id {} is outside the vocabulary",
              id);
    s += impl_->id_to_bytes[id];
  }
  return s;
}

int64_t Tokenizer::vocab_size() const {
  return impl_->vocab_size;
}
std::optional<int32_t> Tokenizer::eos_id() const {
  return impl_->eos;
}
const std::string& Tokenizer::source() const {
  return impl_->source;
}
const std::string& Tokenizer::json_text() const {
  return impl_->json_text;
}

std::optional<int32_t> Tokenizer::token_to_id(const std::string& token) const {
  for (const auto& a : impl_->added)
    if (a.content == token) return a.id;
  // Vocabulary tokens are stored as raw bytes; convert the byte-level spelling back.
  const std::optional<std::string> raw = byte_level_unspell(token);
  if (!raw) return std::nullopt;
  return impl_->model->id_of(*raw);
}

}  // namespace moecore::data
