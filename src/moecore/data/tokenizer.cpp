// HuggingFace byte-level BPE tokenizer (see tokenizer.h). Regexes run on PCRE2 (UTF + Unicode properties, JIT);
// normalization uses utf8proc. Pieces stay raw bytes until BPE, which starts from the vocabulary ids of the
// byte-level characters and applies merges lowest rank first, leftmost first (HuggingFace's order).
#include "moecore/data/tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include <algorithm>
#include <deque>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <queue>
#include <set>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "moecore/core/error.h"

namespace moecore::data {

using json = nlohmann::json;

namespace {

constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// GPT-2's reversible byte → printable character map (bytes_to_unicode).
std::vector<uint32_t> byte_to_codepoint() {
  std::vector<uint32_t> m(256, 0);
  std::vector<bool> direct(256, false);
  for (int b = '!'; b <= '~'; b++) direct[b] = true;
  for (int b = 0xA1; b <= 0xAC; b++) direct[b] = true;
  for (int b = 0xAE; b <= 0xFF; b++) direct[b] = true;
  uint32_t next = 256;
  for (int b = 0; b < 256; b++) m[b] = direct[b] ? static_cast<uint32_t>(b) : next++;
  return m;
}

std::string encode_utf8(uint32_t cp) {
  std::string s;
  utf8proc_uint8_t buf[4];
  const auto n = utf8proc_encode_char(static_cast<utf8proc_int32_t>(cp), buf);
  s.assign(reinterpret_cast<char*>(buf), static_cast<size_t>(n));
  return s;
}

// A compiled PCRE2 pattern shared by threads; each call brings its own match data.
class Regex {
 public:
  Regex(const std::string& pattern, const std::string& where) {
    int err = 0;
    PCRE2_SIZE off = 0;
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), PCRE2_UTF | PCRE2_UCP, &err,
                          &off, nullptr);
    if (!code_) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof(msg));
      MOE_CHECK(false, "{}: regex /{}/ does not compile at offset {}: {}", where, pattern, off,
                reinterpret_cast<char*>(msg));
    }
    jit_ = pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE) == 0;
  }
  ~Regex() { pcre2_code_free(code_); }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Calls fn(start, end) for every non-empty match in s[begin, end).
  template <typename Fn>
  void for_each_match(std::string_view s, Fn fn) const {
    struct Tls {
      pcre2_match_data* md = nullptr;
      pcre2_match_context* mc = nullptr;
      pcre2_jit_stack* js = nullptr;
      ~Tls() {
        if (md) pcre2_match_data_free(md);
        if (mc) pcre2_match_context_free(mc);
        if (js) pcre2_jit_stack_free(js);
      }
    };
    thread_local Tls tls;
    if (!tls.md) {
      tls.md = pcre2_match_data_create(16, nullptr);
      tls.mc = pcre2_match_context_create(nullptr);
      tls.js = pcre2_jit_stack_create(64 * 1024, 8 * 1024 * 1024, nullptr);
      pcre2_jit_stack_assign(tls.mc, nullptr, tls.js);
    }
    size_t pos = 0;
    while (pos <= s.size()) {
      const int rc = pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), pos, PCRE2_NO_UTF_CHECK,
                                 tls.md, tls.mc);
      if (rc == PCRE2_ERROR_NOMATCH) break;
      MOE_CHECK(rc >= 0, "tokenizer regex failed with PCRE2 error {} (input too complex?)", rc);
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(tls.md);
      size_t a = ov[0], b = ov[1];
      if (b == a) {  // empty match: step over one character
        pos = a + 1;
        while (pos < s.size() && (static_cast<unsigned char>(s[pos]) & 0xC0) == 0x80) pos++;
        continue;
      }
      fn(a, b);
      pos = b;
    }
  }

 private:
  pcre2_code* code_ = nullptr;
  bool jit_ = false;
};

// --- normalizers --------------------------------------------------------------------------------------------

struct Normalizer {
  enum Kind { NFC, NFD, NFKC, NFKD, Lowercase, ReplaceString, ReplaceRegex, Prepend, Strip, Sequence };
  Kind kind = Sequence;
  std::string a, b;  // Replace: pattern, content; Prepend: text
  bool left = true, right = true;
  std::unique_ptr<Regex> re;
  std::vector<Normalizer> children;

  // True when the normalizer leaves pure-ASCII text unchanged (Unicode normal forms), so ASCII can skip it.
  bool identity_on_ascii() const {
    switch (kind) {
      case NFC: case NFD: case NFKC: case NFKD: return true;
      case Sequence:
        for (const auto& c : children)
          if (!c.identity_on_ascii()) return false;
        return true;
      default: return false;
    }
  }

  std::string apply(std::string s) const {
    switch (kind) {
      case NFC: return utf8proc_form(s, UTF8PROC_STABLE | UTF8PROC_COMPOSE);
      case NFD: return utf8proc_form(s, UTF8PROC_STABLE | UTF8PROC_DECOMPOSE);
      case NFKC: return utf8proc_form(s, UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT);
      case NFKD: return utf8proc_form(s, UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT);
      case Lowercase: {
        std::string out;
        utf8proc_ssize_t i = 0;
        while (i < static_cast<utf8proc_ssize_t>(s.size())) {
          utf8proc_int32_t cp;
          const auto n = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(s.data()) + i, -1, &cp);
          out += encode_utf8(static_cast<uint32_t>(utf8proc_tolower(cp)));
          i += n;
        }
        return out;
      }
      case ReplaceString: {
        if (a.empty()) return s;
        std::string out;
        size_t pos = 0, hit;
        while ((hit = s.find(a, pos)) != std::string::npos) {
          out.append(s, pos, hit - pos);
          out += b;
          pos = hit + a.size();
        }
        return out + s.substr(pos);
      }
      case ReplaceRegex: {
        std::string out;
        size_t last = 0;
        re->for_each_match(s, [&](size_t x, size_t y) {
          out.append(s, last, x - last);
          out += b;
          last = y;
        });
        return out + s.substr(last);
      }
      case Prepend: return s.empty() ? s : a + s;
      case Strip: {
        size_t x = 0, y = s.size();
        if (left)
          while (x < y && std::isspace(static_cast<unsigned char>(s[x]))) x++;
        if (right)
          while (y > x && std::isspace(static_cast<unsigned char>(s[y - 1]))) y--;
        return s.substr(x, y - x);
      }
      case Sequence:
        for (const auto& c : children) s = c.apply(std::move(s));
        return s;
    }
    return s;
  }

  static std::string utf8proc_form(const std::string& s, int options) {
    utf8proc_uint8_t* out = nullptr;
    const auto n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                                static_cast<utf8proc_ssize_t>(s.size()), &out,
                                static_cast<utf8proc_option_t>(options));
    MOE_CHECK(n >= 0, "Unicode normalization failed: {}", utf8proc_errmsg(n));
    std::string r(reinterpret_cast<char*>(out), static_cast<size_t>(n));
    std::free(out);
    return r;
  }
};

std::string pattern_of(const json& p, const std::string& where, bool& is_regex) {
  MOE_CHECK(p.is_object() && (p.contains("Regex") || p.contains("String")),
            "{}: pattern must be {{\"Regex\": ...}} or {{\"String\": ...}}", where);
  is_regex = p.contains("Regex");
  return is_regex ? p["Regex"].get<std::string>() : p["String"].get<std::string>();
}

std::string regex_escape(const std::string& s) {
  std::string r;
  for (char c : s) {
    if (std::string_view("\\^$.|?*+()[]{}").find(c) != std::string_view::npos) r += '\\';
    r += c;
  }
  return r;
}

Normalizer parse_normalizer(const json& j, const std::string& src) {
  Normalizer n;
  if (j.is_null()) return n;  // empty sequence
  const std::string type = j.value("type", "");
  const std::string where = src + ": normalizer " + type;
  if (type == "NFC") n.kind = Normalizer::NFC;
  else if (type == "NFD") n.kind = Normalizer::NFD;
  else if (type == "NFKC") n.kind = Normalizer::NFKC;
  else if (type == "NFKD") n.kind = Normalizer::NFKD;
  else if (type == "Lowercase") n.kind = Normalizer::Lowercase;
  else if (type == "Prepend") {
    n.kind = Normalizer::Prepend;
    n.a = j.at("prepend").get<std::string>();
  } else if (type == "Strip") {
    n.kind = Normalizer::Strip;
    n.left = j.value("strip_left", true);
    n.right = j.value("strip_right", true);
  } else if (type == "Replace") {
    bool is_regex = false;
    n.a = pattern_of(j.at("pattern"), where, is_regex);
    n.b = j.at("content").get<std::string>();
    n.kind = is_regex ? Normalizer::ReplaceRegex : Normalizer::ReplaceString;
    if (is_regex) n.re = std::make_unique<Regex>(n.a, where);
  } else if (type == "Sequence") {
    for (const auto& c : j.at("normalizers")) n.children.push_back(parse_normalizer(c, src));
  } else {
    MOE_CHECK(false,
              "{}: normalizer type '{}' is not supported (supported: NFC, NFD, NFKC, NFKD, Lowercase, Replace, "
              "Prepend, Strip, Sequence)",
              src, type);
  }
  return n;
}

// --- pre-tokenizers -----------------------------------------------------------------------------------------

enum class SplitBehavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

struct PreTokenizer {
  enum Kind { Split, ByteLevel, Sequence };
  Kind kind = Sequence;
  std::unique_ptr<Regex> re;
  SplitBehavior behavior = SplitBehavior::Isolated;
  bool invert = false;
  bool add_prefix_space = false;
  std::vector<PreTokenizer> children;

  // Splits pieces in place. A piece is a view into `storage` (the normalized text) or, once a prefix space was
  // added, into a string owned by `owned`.
  void apply(std::vector<std::string_view>& pieces, std::deque<std::string>& owned) const {
    if (kind == Sequence) {
      for (const auto& c : children) c.apply(pieces, owned);
      return;
    }
    std::vector<std::string_view> out;
    out.reserve(pieces.size() * 2);
    for (std::string_view p : pieces) {
      if (kind == ByteLevel && add_prefix_space && !p.empty() && p[0] != ' ') {
        owned.push_back(" " + std::string(p));
        p = owned.back();
      }
      if (!re) {
        out.push_back(p);
        continue;
      }
      split(p, out);
    }
    pieces = std::move(out);
  }

  void split(std::string_view s, std::vector<std::string_view>& out) const {
    if (behavior == SplitBehavior::Isolated && !invert) {  // the common case: matches and gaps, in order
      size_t last = 0;
      re->for_each_match(s, [&](size_t a, size_t b) {
        if (a > last) out.push_back(s.substr(last, a - last));
        out.push_back(s.substr(a, b - a));
        last = b;
      });
      if (last < s.size()) out.push_back(s.substr(last));
      return;
    }
    // Segments covering s: (begin, end, is_match).
    std::vector<std::tuple<size_t, size_t, bool>> seg;
    size_t last = 0;
    re->for_each_match(s, [&](size_t a, size_t b) {
      if (a > last) seg.emplace_back(last, a, false);
      seg.emplace_back(a, b, true);
      last = b;
    });
    if (last < s.size()) seg.emplace_back(last, s.size(), false);
    if (invert)
      for (auto& t : seg) std::get<2>(t) = !std::get<2>(t);
    // Merging only ever joins adjacent segments, so every output piece is a contiguous view of s.
    size_t pend_begin = 0;
    bool have_pending = false;  // MergedWithNext: matches waiting for the next gap
    for (size_t i = 0; i < seg.size(); i++) {
      const size_t a = std::get<0>(seg[i]), b = std::get<1>(seg[i]);
      const bool m = std::get<2>(seg[i]);
      auto extend_last = [&] {
        const size_t from = static_cast<size_t>(out.back().data() - s.data());
        out.back() = s.substr(from, b - from);
      };
      switch (behavior) {
        case SplitBehavior::Removed:
          if (!m) out.push_back(s.substr(a, b - a));
          break;
        case SplitBehavior::Isolated: out.push_back(s.substr(a, b - a)); break;
        case SplitBehavior::MergedWithPrevious:
          if (m && i > 0 && !std::get<2>(seg[i - 1]))
            extend_last();
          else
            out.push_back(s.substr(a, b - a));
          break;
        case SplitBehavior::MergedWithNext:
          if (m) {
            if (!have_pending) pend_begin = a;
            have_pending = true;
          } else {
            const size_t from = have_pending ? pend_begin : a;
            out.push_back(s.substr(from, b - from));
            have_pending = false;
          }
          break;
        case SplitBehavior::Contiguous:
          if (m && i > 0 && std::get<2>(seg[i - 1]))
            extend_last();
          else
            out.push_back(s.substr(a, b - a));
          break;
      }
    }
    if (have_pending) out.push_back(s.substr(pend_begin));
  }
};

PreTokenizer parse_pretokenizer(const json& j, const std::string& src, bool& has_byte_level) {
  PreTokenizer p;
  if (j.is_null()) return p;
  const std::string type = j.value("type", "");
  const std::string where = src + ": pre_tokenizer " + type;
  if (type == "Sequence") {
    for (const auto& c : j.at("pretokenizers")) p.children.push_back(parse_pretokenizer(c, src, has_byte_level));
  } else if (type == "Split") {
    p.kind = PreTokenizer::Split;
    bool is_regex = false;
    std::string pat = pattern_of(j.at("pattern"), where, is_regex);
    p.re = std::make_unique<Regex>(is_regex ? pat : regex_escape(pat), where);
    const std::string b = j.value("behavior", "Isolated");
    if (b == "Removed") p.behavior = SplitBehavior::Removed;
    else if (b == "Isolated") p.behavior = SplitBehavior::Isolated;
    else if (b == "MergedWithPrevious") p.behavior = SplitBehavior::MergedWithPrevious;
    else if (b == "MergedWithNext") p.behavior = SplitBehavior::MergedWithNext;
    else if (b == "Contiguous") p.behavior = SplitBehavior::Contiguous;
    else MOE_CHECK(false, "{}: unknown split behavior '{}'", where, b);
    p.invert = j.value("invert", false);
  } else if (type == "ByteLevel") {
    p.kind = PreTokenizer::ByteLevel;
    has_byte_level = true;
    p.add_prefix_space = j.value("add_prefix_space", false);
    if (j.value("use_regex", true)) p.re = std::make_unique<Regex>(kGpt2Pattern, where);
  } else if (type == "Digits") {
    p.kind = PreTokenizer::Split;
    p.re = std::make_unique<Regex>(j.value("individual_digits", false) ? "\\p{N}" : "\\p{N}+", where);
  } else {
    MOE_CHECK(false,
              "{}: pre_tokenizer type '{}' is not supported (supported: Split, ByteLevel, Digits, Sequence; "
              "SentencePiece-style Metaspace tokenizers are not byte-level BPE)",
              src, type);
  }
  return p;
}

// Open-addressing map from a merge pair (a, b) to (rank, merged id): one cache line per probe, where a node-based
// map costs a pointer chase; BPE asks it for every adjacent pair of every new word.
class MergeTable {
 public:
  void build(const std::vector<std::pair<uint64_t, std::pair<int32_t, int32_t>>>& items) {
    size_t cap = 16;
    while (cap < items.size() * 2) cap <<= 1;
    keys_.assign(cap, kEmpty);
    vals_.assign(cap, {0, 0});
    mask_ = cap - 1;
    for (const auto& [k, v] : items) {
      size_t i = hash(k) & mask_;
      while (keys_[i] != kEmpty && keys_[i] != k) i = (i + 1) & mask_;
      if (keys_[i] == kEmpty) {  // the first (lowest-rank) merge of a pair wins
        keys_[i] = k;
        vals_[i] = v;
      }
    }
  }
  const std::pair<int32_t, int32_t>* find(uint64_t k) const {
    size_t i = hash(k) & mask_;
    while (true) {
      if (keys_[i] == k) return &vals_[i];
      if (keys_[i] == kEmpty) return nullptr;
      i = (i + 1) & mask_;
    }
  }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};
  static size_t hash(uint64_t k) { return static_cast<size_t>((k * 0x9E3779B97F4A7C15ull) >> 17); }
  std::vector<uint64_t> keys_;
  std::vector<std::pair<int32_t, int32_t>> vals_;
  size_t mask_ = 0;
};

struct AddedToken {
  std::string content;
  int32_t id;
  bool special, lstrip, rstrip;
};

struct BpeCacheEntry {
  std::vector<int32_t> ids;
};

}  // namespace

int64_t find_invalid_utf8(std::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    utf8proc_int32_t cp;
    const auto n = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(text.data()) + i,
                                    static_cast<utf8proc_ssize_t>(text.size() - i), &cp);
    if (n < 0) return static_cast<int64_t>(i);
    i += static_cast<size_t>(n);
  }
  return -1;
}

struct Tokenizer::Impl {
  std::string source;
  Normalizer normalizer;
  PreTokenizer pre;
  std::unordered_map<std::string, int32_t> bytes_to_id;  // raw bytes of a vocabulary token -> id
  std::vector<std::string> id_to_bytes;                  // raw bytes (or added-token text) per id
  std::vector<bool> is_added;
  int32_t byte_id[256];
  MergeTable merges;  // (a, b) -> (rank, merged id)
  std::vector<AddedToken> added;                                      // longest first
  std::vector<std::vector<const AddedToken*>> added_by_byte;          // [first byte] -> candidates, longest first
  bool ignore_merges = false;
  int64_t vocab_size = 0;
  std::optional<int32_t> eos;
  uint64_t serial = 0;

  bool ascii_fast = false;  // normalizer is the identity on ASCII text
  void bpe(std::string_view piece, std::vector<int32_t>& out) const;
  void encode_text(std::string_view text, std::vector<int32_t>& out) const;
};

namespace {
uint64_t next_serial() {
  static std::atomic<uint64_t> s{1};
  return s++;
}
}  // namespace

namespace {
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
}  // namespace

void Tokenizer::Impl::bpe(std::string_view piece, std::vector<int32_t>& out) const {
  // Per-thread cache of whole pieces: text repeats words constantly.
  struct Cache {
    uint64_t owner = 0;
    std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> map;
  };
  thread_local Cache cache;
  if (cache.owner != serial) {
    cache.map.clear();
    cache.owner = serial;
  }
  if (auto it = cache.map.find(piece); it != cache.map.end()) {
    out.insert(out.end(), it->second.begin(), it->second.end());
    return;
  }
  std::vector<int32_t> sym;
  if (ignore_merges) {
    if (auto it = bytes_to_id.find(std::string(piece)); it != bytes_to_id.end()) sym.push_back(it->second);
  }
  if (sym.empty()) {
    sym.reserve(piece.size());
    for (unsigned char c : piece) sym.push_back(byte_id[c]);
    while (sym.size() > 1) {
      int32_t best_rank = INT32_MAX, best_id = -1;
      size_t best_i = 0;
      for (size_t i = 0; i + 1 < sym.size(); i++) {
        const auto* hit = merges.find((static_cast<uint64_t>(static_cast<uint32_t>(sym[i])) << 32) |
                                      static_cast<uint32_t>(sym[i + 1]));
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
  cache.map.emplace(std::string(piece), std::move(sym));
}

void Tokenizer::Impl::encode_text(std::string_view text, std::vector<int32_t>& out) const {
  if (text.empty()) return;
  bool ascii = ascii_fast;
  for (size_t i = 0; ascii && i < text.size(); i++) ascii = static_cast<unsigned char>(text[i]) < 0x80;
  std::string normalized;
  if (!ascii) {
    normalized = normalizer.apply(std::string(text));
    text = normalized;
  }
  std::vector<std::string_view> pieces{text};
  std::deque<std::string> owned;  // stable addresses: pieces view into it
  pre.apply(pieces, owned);
  for (std::string_view p : pieces)
    if (!p.empty()) bpe(p, out);
}

Tokenizer::Tokenizer() : impl_(std::make_unique<Impl>()) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

namespace {
std::string read_file(const std::string& path, const char* what) {
  std::ifstream f(path, std::ios::binary);
  MOE_CHECK(f.good(), "cannot open {} {}: {}", what, path, std::strerror(errno));
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string token_name(const json& j) {
  if (j.is_string()) return j.get<std::string>();
  if (j.is_object() && j.contains("content")) return j["content"].get<std::string>();
  return "";
}
}  // namespace

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
      MOE_CHECK(t.impl_->eos.has_value(), "{}: eos_token '{}' is not in the vocabulary of {}", cfg.string(), eos,
                path);
    }
  }
  return t;
}

Tokenizer Tokenizer::from_json(const std::string& text, const std::string& src) {
  Tokenizer t;
  Impl& m = *t.impl_;
  m.source = src;
  m.serial = next_serial();
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
    const std::string type = model.value("type", "");
    MOE_CHECK(type == "BPE",
              "{}: model type '{}' is not supported; moecore reads byte-level BPE tokenizers (Qwen, DeepSeek, "
              "Llama-3, GPT-2 style)",
              src, type.empty() ? "(missing)" : type);
    MOE_CHECK(model.value("dropout", json()).is_null() || model["dropout"].get<double>() == 0.0,
              "{}: BPE dropout is not supported", src);
    MOE_CHECK(!model.value("byte_fallback", false),
              "{}: BPE with byte_fallback (SentencePiece style) is not supported", src);
    for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"}) {
      const json v = model.value(k, json());
      MOE_CHECK(v.is_null() || v.get<std::string>().empty(), "{}: BPE {} is not supported", src, k);
    }
    m.ignore_merges = model.value("ignore_merges", false);
    bool byte_level = false;
    m.normalizer = parse_normalizer(j.value("normalizer", json()), src);
    m.pre = parse_pretokenizer(j.value("pre_tokenizer", json()), src, byte_level);
    m.ascii_fast = m.normalizer.identity_on_ascii();
    MOE_CHECK(byte_level, "{}: no ByteLevel pre-tokenizer; only byte-level BPE tokenizers are supported", src);
    // Vocabulary: byte-level strings -> raw bytes.
    const auto b2c = byte_to_codepoint();
    std::unordered_map<uint32_t, uint8_t> c2b;
    for (int b = 0; b < 256; b++) c2b[b2c[b]] = static_cast<uint8_t>(b);
    const json& vocab = model.at("vocab");
    MOE_CHECK(vocab.is_object() && !vocab.empty(), "{}: model.vocab must be a non-empty object", src);
    // Ids index dense tables: bound them by the token count so a corrupt file cannot demand gigabytes.
    const int64_t id_bound = 2 * static_cast<int64_t>(vocab.size() + j.value("added_tokens", json::array()).size()) + 1024;
    int32_t max_id = -1;
    for (auto it = vocab.begin(); it != vocab.end(); ++it) {
      const int64_t id = it.value().get<int64_t>();
      MOE_CHECK(id >= 0 && id < id_bound, "{}: token '{}' has id {}, outside [0, {}) for a vocabulary of {} tokens",
                src, it.key(), id, id_bound, vocab.size());
      max_id = std::max(max_id, static_cast<int32_t>(id));
    }
    m.id_to_bytes.assign(static_cast<size_t>(max_id) + 1, std::string());
    m.is_added.assign(static_cast<size_t>(max_id) + 1, false);
    std::vector<bool> present(static_cast<size_t>(max_id) + 1, false);
    for (auto it = vocab.begin(); it != vocab.end(); ++it) {
      const std::string& tok = it.key();
      const int32_t id = it.value().get<int32_t>();
      MOE_CHECK(id >= 0, "{}: negative id {} for token '{}'", src, id, tok);
      std::string raw;
      bool ok = true;
      utf8proc_ssize_t i = 0;
      while (i < static_cast<utf8proc_ssize_t>(tok.size())) {
        utf8proc_int32_t cp;
        const auto n = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(tok.data()) + i, -1, &cp);
        if (n <= 0) {
          ok = false;
          break;
        }
        auto f = c2b.find(static_cast<uint32_t>(cp));
        if (f == c2b.end()) {
          ok = false;
          break;
        }
        raw += static_cast<char>(f->second);
        i += n;
      }
      // Tokens outside the byte alphabet (special tokens listed in the vocabulary) keep their text.
      m.id_to_bytes[id] = ok ? raw : tok;
      present[id] = true;
      if (ok) m.bytes_to_id.emplace(raw, id);
    }
    for (int b = 0; b < 256; b++) {
      auto it = m.bytes_to_id.find(std::string(1, static_cast<char>(b)));
      MOE_CHECK(it != m.bytes_to_id.end(), "{}: the vocabulary lacks the byte-level symbol for byte {}", src, b);
      m.byte_id[b] = it->second;
    }
    // Merges: "a b" strings or ["a", "b"] pairs, rank = position.
    const json& merges = model.at("merges");
    std::vector<std::pair<uint64_t, std::pair<int32_t, int32_t>>> merge_items;
    merge_items.reserve(merges.size());
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
      const uint64_t key = (static_cast<uint64_t>(ia.value().get<uint32_t>()) << 32) | ib.value().get<uint32_t>();
      merge_items.emplace_back(key, std::make_pair(rank, iab.value().get<int32_t>()));
      rank++;
    }
    m.merges.build(merge_items);
    // Added tokens.
    for (const auto& a : j.value("added_tokens", json::array())) {
      AddedToken at{a.at("content").get<std::string>(), a.at("id").get<int32_t>(), a.value("special", false),
                    a.value("lstrip", false), a.value("rstrip", false)};
      MOE_CHECK(at.id >= 0 && at.id < id_bound && !at.content.empty(), "{}: invalid added token (id {})", src, at.id);
      if (at.id >= static_cast<int32_t>(m.id_to_bytes.size())) {
        m.id_to_bytes.resize(static_cast<size_t>(at.id) + 1);
        m.is_added.resize(static_cast<size_t>(at.id) + 1, false);
        present.resize(static_cast<size_t>(at.id) + 1, false);
      }
      m.id_to_bytes[at.id] = at.content;
      m.is_added[at.id] = true;
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

int64_t Tokenizer::vocab_size() const { return impl_->vocab_size; }
std::optional<int32_t> Tokenizer::eos_id() const { return impl_->eos; }
const std::string& Tokenizer::source() const { return impl_->source; }

std::optional<int32_t> Tokenizer::token_to_id(const std::string& token) const {
  for (const auto& a : impl_->added)
    if (a.content == token) return a.id;
  // Vocabulary tokens are stored as raw bytes; convert the byte-level spelling back.
  const auto b2c = byte_to_codepoint();
  std::unordered_map<uint32_t, uint8_t> c2b;
  for (int b = 0; b < 256; b++) c2b[b2c[b]] = static_cast<uint8_t>(b);
  std::string raw;
  utf8proc_ssize_t i = 0;
  while (i < static_cast<utf8proc_ssize_t>(token.size())) {
    utf8proc_int32_t cp;
    const auto n = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(token.data()) + i, -1, &cp);
    if (n <= 0) return std::nullopt;
    auto f = c2b.find(static_cast<uint32_t>(cp));
    if (f == c2b.end()) return std::nullopt;
    raw += static_cast<char>(f->second);
    i += n;
  }
  auto it = impl_->bytes_to_id.find(raw);
  if (it == impl_->bytes_to_id.end()) return std::nullopt;
  return it->second;
}

// --- BPE training -------------------------------------------------------------------------------------------
// Byte-level BPE: words from the GPT-2 pre-tokenizer pattern, counted; then repeatedly merge the most frequent
// adjacent pair (ties: the pair of lower ids), updating pair counts only in the words that contain the pair.

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
  // Write the HuggingFace tokenizer.json.
  const auto b2c = byte_to_codepoint();
  auto spell = [&](const std::string& raw) {
    std::string s;
    for (unsigned char ch : raw) s += encode_utf8(b2c[ch]);
    return s;
  };
  json vocab = json::object();
  for (size_t i = 0; i < tok_bytes.size(); i++) vocab[spell(tok_bytes[i])] = static_cast<int64_t>(i);
  json jm = json::array();
  for (auto [a, b] : merges) jm.push_back(json::array({spell(tok_bytes[a]), spell(tok_bytes[b])}));
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
         json::array({{{"type", "Split"},
                       {"pattern", {{"Regex", kGpt2Pattern}}},
                       {"behavior", "Isolated"},
                       {"invert", false}},
                      {{"type", "ByteLevel"},
                       {"add_prefix_space", false},
                       {"trim_offsets", false},
                       {"use_regex", false}}})}}},
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

}  // namespace moecore::data
