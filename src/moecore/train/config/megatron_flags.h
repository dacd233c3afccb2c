// A rule for every Megatron-LM flag that is not in moecore's flag table, so a Megatron launch script runs through
// `moecore train` unchanged or is refused before any work with the reason: no effect (an implementation selector
// that cannot change the math here; listed once at the start of the run), no effect for some values only (refused
// for the others), or refused (the feature named, with what to use instead). Megatron's flag list itself
// (tests/train/megatron_flags.txt, made by scripts/megatron_flags.py) is compiled in; the rules live in
// megatron_flag_rules.cpp. Not here: the flags moecore implements (flag_table.cpp).
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace moecore::train {

// How many values a Megatron flag takes (argparse): none, one, zero or one (nargs='?'), one or more.
enum class MegatronArity { Switch, Value, Optional, List };

// One line of tests/train/megatron_flags.txt: the name without dashes, its arity and argparse choices (if any).
struct MegatronFlag {
  std::string name;
  MegatronArity arity = MegatronArity::Switch;
  std::vector<std::string> choices;
};
// Every flag of Megatron-LM's pretrain_gpt.py parser (core_v0.15.3 and the newest commit), sorted by name.
const std::vector<MegatronFlag>& megatron_flags();
const MegatronFlag* find_megatron_flag(const std::string& name);  // null if Megatron has no such flag

enum class RuleKind {
  NoEffect,     // accepted; listed at the start of the run with `why`
  NoEffectFor,  // accepted with one of `values` (listed as above); any other value is refused with `otherwise`
  Refused,      // refused before any work: "--flag: `why`" (the feature, and what to use instead)
};

// One rule shared by the flags it names (without dashes) and the flags starting with one of its prefixes.
struct FlagRule {
  RuleKind kind = RuleKind::Refused;
  std::string why;
  std::vector<std::string> names, prefixes;
  std::vector<std::string> values;  // NoEffectFor: the values without effect
  std::string otherwise;            // NoEffectFor: the refusal of any other value
};
const std::vector<FlagRule>& megatron_flag_rules();
// The rule for a Megatron flag (a name listed in a rule first, then the longest matching prefix); null if none.
const FlagRule* megatron_rule(const std::string& name);
// The Megatron flags the table does not hold: the ones parse_flags registers with their rule.
std::vector<const MegatronFlag*> megatron_ruled_flags();

// The rule flags a command line or YAML file gave, with their values as given (a switch: none, or "true"/"false"
// from YAML).
using GivenFlags = std::vector<std::pair<std::string, std::vector<std::string>>>;
// Records `name` given with `values`: a flag given before keeps its place and takes these values (argparse keeps the
// last occurrence).
void give_megatron_flag(GivenFlags& given, const std::string& name, std::vector<std::string> values);
// Throws Error for the first refused flag or value (naming the flag, the value and what to do instead).
void check_megatron_flags(const GivenFlags& given);
// "--flag [value]: why" for each no-effect flag given (a switch set to false is not listed), in the given order.
std::vector<std::string> megatron_no_effect_lines(const GivenFlags& given);
// The values a no-effect Megatron flag was given with, read back from its line in `no_effect` (TrainConfig's list,
// "--name [values]: why"; validate() checks Megatron's rules on them); nullopt if it was not given.
std::optional<std::vector<std::string>> given_megatron_values(const std::vector<std::string>& no_effect,
                                                              const std::string& name);
// What the start of a run prints for them: a "no effect in moecore:" heading and the lines; empty if none.
std::string describe_no_effect(const std::vector<std::string>& lines);

// docs/megatron-flags.md: every Megatron flag with its status (implemented, no effect, refused) and why.
std::string megatron_flags_markdown();

}  // namespace moecore::train
