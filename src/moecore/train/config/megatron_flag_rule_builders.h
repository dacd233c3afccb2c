// Builders for the rules of Megatron-LM's flags (megatron_flag_rules*.cpp): one rule, many flags.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "moecore/train/config/megatron_flags.h"

namespace moecore::train::rule_builders {

using Names = std::vector<std::string>;

inline FlagRule no_effect(std::string why, Names names, Names prefixes = {}) {
  return {RuleKind::NoEffect, std::move(why), std::move(names), std::move(prefixes), {}, {}};
}
inline FlagRule refused(std::string why, Names names, Names prefixes = {}) {
  return {RuleKind::Refused, std::move(why), std::move(names), std::move(prefixes), {}, {}};
}
inline FlagRule no_effect_for(Names names, Names values, std::string why, std::string otherwise) {
  return {RuleKind::NoEffectFor, std::move(why), std::move(names), {}, std::move(values), std::move(otherwise)};
}
// "<feature> is not supported by moecore[; <instead>]"
inline std::string unsupported(const std::string& feature, const std::string& instead = "") {
  return feature + " is not supported by moecore" + (instead.empty() ? "" : "; " + instead);
}

}  // namespace moecore::train::rule_builders
