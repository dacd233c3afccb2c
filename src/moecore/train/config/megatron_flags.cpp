// Megatron-LM's flag list (compiled in from tests/train/megatron_flags.txt by CMake), the lookups over the rules
// (megatron_flag_rules.cpp), the refusal and no-effect passes over the flags a run was given, and the markdown
// table of docs/megatron-flags.md. Registering the flags with CLI11 and YAML: flag_parser.cpp.
#include "moecore/train/config/megatron_flags.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <sstream>

#include "moecore/core/error.h"
#include "moecore/train/config/config.h"

namespace moecore::train {

extern const char* const kMegatronFlagsText;  // generated: the text of tests/train/megatron_flags.txt

namespace {

std::vector<MegatronFlag> parse_flag_list() {
  std::vector<MegatronFlag> flags;
  std::istringstream in(kMegatronFlagsText);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream words(line);
    std::string name, arity, choices;
    words >> name >> arity >> choices;
    MOE_ASSERT_MSG(name.rfind("--", 0) == 0, "megatron_flags.txt: bad line '{}'", line);
    MegatronFlag f;
    f.name = name.substr(2);
    if (arity == "switch") {
      f.arity = MegatronArity::Switch;
    } else if (arity == "value") {
      f.arity = MegatronArity::Value;
    } else if (arity == "optional") {
      f.arity = MegatronArity::Optional;
    } else {
      MOE_ASSERT_MSG(arity == "list", "megatron_flags.txt: bad arity in '{}'", line);
      f.arity = MegatronArity::List;
    }
    for (size_t start = 0; !choices.empty() && start <= choices.size();) {
      const size_t comma = std::min(choices.find(',', start), choices.size());
      f.choices.push_back(choices.substr(start, comma - start));
      start = comma + 1;
    }
    flags.push_back(std::move(f));
  }
  return flags;
}

bool switch_off(const std::vector<std::string>& values) {  // a YAML `flag: false`
  return values.size() == 1 && (values[0] == "false" || values[0] == "0");
}

std::string shown(const std::string& name, const std::vector<std::string>& values) {
  std::string s = "--" + name;
  for (const auto& v : values) s += " " + v;
  return s;
}

std::string trimmed(const std::string& v) {  // " x" from a YAML list or a quoted argument: x
  const size_t b = v.find_first_not_of(' ');
  return b == std::string::npos ? "" : v.substr(b);
}

std::string joined(const std::vector<std::string>& v, const char* sep) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : sep) + x;
  return s;
}

}  // namespace

const std::vector<MegatronFlag>& megatron_flags() {
  static const std::vector<MegatronFlag> flags = parse_flag_list();
  return flags;
}

const MegatronFlag* find_megatron_flag(const std::string& name) {
  static const std::map<std::string, const MegatronFlag*> by_name = [] {
    std::map<std::string, const MegatronFlag*> m;
    for (const auto& f : megatron_flags()) m[f.name] = &f;
    return m;
  }();
  const auto it = by_name.find(name);
  return it == by_name.end() ? nullptr : it->second;
}

namespace {

const FlagRule* find_rule(const std::string& name) {
  const FlagRule* best = nullptr;
  size_t best_len = 0;
  for (const auto& r : megatron_flag_rules()) {
    if (std::find(r.names.begin(), r.names.end(), name) != r.names.end()) return &r;
    for (const auto& p : r.prefixes)
      if (name.rfind(p, 0) == 0 && p.size() > best_len) best = &r, best_len = p.size();
  }
  return best;
}

}  // namespace

const FlagRule* megatron_rule(const std::string& name) {  // looked up once per name: every parse asks for each
  static std::map<std::string, const FlagRule*> cache;
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  const auto it = cache.find(name);
  if (it != cache.end()) return it->second;
  return cache[name] = find_rule(name);
}

std::vector<const MegatronFlag*> megatron_ruled_flags() {
  static const std::vector<const MegatronFlag*> ruled = [] {
    std::vector<const MegatronFlag*> out;
    for (const auto& f : megatron_flags())
      if (find_flag(f.name) == nullptr && megatron_rule(f.name) != nullptr) out.push_back(&f);
    return out;
  }();
  return ruled;
}

void give_megatron_flag(GivenFlags& given, const std::string& name, std::vector<std::string> values) {
  const auto it = std::find_if(given.begin(), given.end(), [&](const auto& g) { return g.first == name; });
  if (it != given.end())
    it->second = std::move(values);
  else
    given.emplace_back(name, std::move(values));
}

void check_megatron_flags(const GivenFlags& given) {
  for (const auto& [name, raw] : given) {
    const FlagRule* r = megatron_rule(name);
    MOE_ASSERT_MSG(r != nullptr, "--{} has no rule", name);
    if (switch_off(raw) && find_megatron_flag(name)->arity == MegatronArity::Switch) continue;
    std::vector<std::string> values;
    for (const auto& v : raw) values.push_back(trimmed(v));
    MOE_CHECK(r->kind != RuleKind::Refused, "{}: {}", shown(name, values), r->why);
    if (r->kind == RuleKind::NoEffectFor)
      for (const auto& v : values)
        MOE_CHECK(std::find(r->values.begin(), r->values.end(), v) != r->values.end(),
                  "--{} {}: {} (no effect in moecore only with {})", name, v, r->otherwise, joined(r->values, ", "));
  }
}

std::vector<std::string> megatron_no_effect_lines(const GivenFlags& given) {
  std::vector<std::string> lines;
  for (const auto& [name, raw] : given) {
    const FlagRule* r = megatron_rule(name);
    if (r == nullptr || r->kind == RuleKind::Refused) continue;
    const bool is_switch = find_megatron_flag(name)->arity == MegatronArity::Switch;
    if (is_switch && switch_off(raw)) continue;
    std::vector<std::string> values;
    if (!is_switch)
      for (const auto& v : raw) values.push_back(trimmed(v));
    lines.push_back(fmt::format("{}: {}", shown(name, values), r->why));
  }
  return lines;
}

std::optional<std::vector<std::string>> given_megatron_values(const std::vector<std::string>& no_effect,
                                                              const std::string& name) {
  const std::string flag = "--" + name;
  for (const auto& l : no_effect) {
    if (l.rfind(flag, 0) != 0 || l.size() == flag.size()) continue;
    if (l[flag.size()] == ':') return std::vector<std::string>{};
    if (l[flag.size()] != ' ') continue;  // another flag with this one's name as its prefix
    std::vector<std::string> values;
    std::istringstream words(l.substr(flag.size(), l.find(": ", flag.size()) - flag.size()));
    for (std::string w; words >> w;) values.push_back(w);
    return values;
  }
  return std::nullopt;
}

std::string describe_no_effect(const std::vector<std::string>& lines) {
  if (lines.empty()) return "";
  std::string s = "no effect in moecore:\n";
  for (const auto& l : lines) s += "  " + l + "\n";
  return s;
}

std::string megatron_flags_markdown() {
  std::string s =
      "# Megatron-LM flags in moecore\n\n"
      "Every flag of Megatron-LM's `pretrain_gpt.py` parser (the union of core_v0.15.3 and the newest commit, "
      "extracted by\n`scripts/megatron_flags.py` into `tests/train/megatron_flags.txt`) and what `moecore train` "
      "does with it:\n\n"
      "- **implemented**: in moecore's flag table with Megatron's semantics (`moecore train --help`);\n"
      "- **no effect**: accepted and listed once at the start of the run under \"no effect in moecore:\" with the "
      "reason;\n"
      "- **no effect for** some values: accepted with those values (and listed), refused with any other;\n"
      "- **refused**: the run stops before any work, on every rank, naming the flag, the feature and what to do "
      "instead.\n\n"
      "Generated by `moecore flags --markdown` (a test keeps this file equal to its output).\n\n"
      "| Flag | Status | Why |\n|---|---|---|\n";
  auto esc = [](std::string t) {
    std::string o;
    for (char ch : t) o += ch == '|' ? std::string("\\|") : std::string(1, ch);
    return o;
  };
  for (const auto& f : megatron_flags()) {
    std::string status, why;
    if (const FlagSpec* spec = find_flag(f.name)) {
      status = "implemented";
      why = spec->help;
    } else if (const FlagRule* r = megatron_rule(f.name)) {
      status = r->kind == RuleKind::NoEffect      ? "no effect"
               : r->kind == RuleKind::NoEffectFor ? "no effect for " + joined(r->values, ", ")
                                                  : "refused";
      why = r->kind == RuleKind::NoEffectFor ? r->why + "; other values: " + r->otherwise : r->why;
    } else {
      status = "unknown";
    }
    s += fmt::format("| `--{}` | {} | {} |\n", f.name, esc(status), esc(why));
  }
  s += "\nmoecore's own flags (not Megatron's): ";
  std::string own;
  for (const auto& f : flag_table())
    if (find_megatron_flag(f.name) == nullptr) own += (own.empty() ? "`--" : ", `--") + f.name + "`";
  return s + own + ".\n";
}

}  // namespace moecore::train
