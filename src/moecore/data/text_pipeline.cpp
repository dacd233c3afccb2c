// Normalizers and pre-tokenizers of a tokenizer.json (see text_pipeline.h). Normalization uses utf8proc; pieces
// stay views into the text (no copies) until BPE.
#include "moecore/data/text_pipeline.h"

#include <utf8proc.h>

#include <cctype>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <tuple>

#include "moecore/core/error.h"
#include "moecore/data/utf8.h"

namespace moecore::data {

using json = nlohmann::json;

// --- normalizers --------------------------------------------------------------------------------------------

namespace {
std::string utf8proc_form(const std::string& s, int options) {
  utf8proc_uint8_t* out = nullptr;
  const auto n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                              static_cast<utf8proc_ssize_t>(s.size()), &out, static_cast<utf8proc_option_t>(options));
  MOE_CHECK(n >= 0, "Unicode normalization failed: {}", utf8proc_errmsg(n));
  std::string r(reinterpret_cast<char*>(out), static_cast<size_t>(n));
  std::free(out);
  return r;
}
}  // namespace

bool Normalizer::identity_on_ascii() const {
  switch (kind) {
    case NFC:
    case NFD:
    case NFKC:
    case NFKD:
      return true;
    case Sequence:
      for (const auto& c : children)
        if (!c.identity_on_ascii()) return false;
      return true;
    default:
      return false;
  }
}

std::string Normalizer::apply(std::string s) const {
  switch (kind) {
    case NFC:
      return utf8proc_form(s, UTF8PROC_STABLE | UTF8PROC_COMPOSE);
    case NFD:
      return utf8proc_form(s, UTF8PROC_STABLE | UTF8PROC_DECOMPOSE);
    case NFKC:
      return utf8proc_form(s, UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT);
    case NFKD:
      return utf8proc_form(s, UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT);
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
    case Prepend:
      return s.empty() ? s : a + s;
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

// --- pre-tokenizers -----------------------------------------------------------------------------------------

void PreTokenizer::apply(std::vector<std::string_view>& pieces, std::deque<std::string>& owned) const {
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

void PreTokenizer::split(std::string_view s, std::vector<std::string_view>& out) const {
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
      case SplitBehavior::Isolated:
        out.push_back(s.substr(a, b - a));
        break;
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

// --- tokenizer.json sections --------------------------------------------------------------------------------

namespace {

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
  if (type == "NFC")
    n.kind = Normalizer::NFC;
  else if (type == "NFD")
    n.kind = Normalizer::NFD;
  else if (type == "NFKC")
    n.kind = Normalizer::NFKC;
  else if (type == "NFKD")
    n.kind = Normalizer::NFKD;
  else if (type == "Lowercase")
    n.kind = Normalizer::Lowercase;
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
    if (b == "Removed")
      p.behavior = SplitBehavior::Removed;
    else if (b == "Isolated")
      p.behavior = SplitBehavior::Isolated;
    else if (b == "MergedWithPrevious")
      p.behavior = SplitBehavior::MergedWithPrevious;
    else if (b == "MergedWithNext")
      p.behavior = SplitBehavior::MergedWithNext;
    else if (b == "Contiguous")
      p.behavior = SplitBehavior::Contiguous;
    else
      MOE_CHECK(false, "{}: unknown split behavior '{}'", where, b);
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

}  // namespace

TextPipeline TextPipeline::from_json(const json& normalizer, const json& pre_tokenizer, const std::string& src) {
  TextPipeline t;
  t.normalizer = parse_normalizer(normalizer, src);
  t.pre = parse_pretokenizer(pre_tokenizer, src, t.byte_level);
  t.ascii_fast = t.normalizer.identity_on_ascii();
  return t;
}

void TextPipeline::words(std::string_view text, std::string& normalized, std::deque<std::string>& owned,
                         std::vector<std::string_view>& out) const {
  bool ascii = ascii_fast;
  for (size_t i = 0; ascii && i < text.size(); i++) ascii = static_cast<unsigned char>(text[i]) < 0x80;
  if (!ascii) {
    normalized = normalizer.apply(std::string(text));
    text = normalized;
  }
  out.assign(1, text);
  pre.apply(out, owned);
}

}  // namespace moecore::data
