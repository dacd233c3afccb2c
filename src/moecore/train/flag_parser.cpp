// The `moecore train` argument parser (see config.h, parse_flags): CLI11 options and YAML keys made from the flag
// table, --help grouped as the table groups them with each default. It returns what each source says and applies
// nothing; it reads no file but the --config YAML (presets, HF configs, checkpoints: start_config.cpp).
#include <yaml-cpp/yaml.h>

#include <CLI/CLI.hpp>
#include <map>

#include "moecore/core/error.h"
#include "moecore/train/config.h"

namespace moecore::train {

namespace {

std::string dashed(std::string name) {
  for (char& ch : name)
    if (ch == '_') ch = '-';
  return name;
}

// The mapping's keys and values into `layer` (yaml-cpp conversions throw YAML::Exception).
void add_yaml_values(const YAML::Node& yaml, const std::string& file, FlagLayer& layer) {
  for (const auto& kv : yaml) {
    const std::string key = kv.first.as<std::string>();
    std::string name = key;
    for (char& ch : name)
      if (ch == '_') ch = '-';
    for (const auto& f : flag_table())  // Megatron spells a few with an underscore: --override-opt_param-scheduler
      if (f.name != name && dashed(f.name) == name) name = f.name;
    MOE_CHECK(find_flag(name) != nullptr, "--config {}: unknown key '{}' (keys are moecore train's flag names)", file,
              key);
    std::vector<std::string> vals;
    if (kv.second.IsSequence()) {
      for (const auto& v : kv.second) vals.push_back(v.as<std::string>());
    } else {
      MOE_CHECK(kv.second.IsScalar(), "--config {}: '{}' must be a scalar or a list", file, key);
      vals.push_back(kv.second.as<std::string>());
    }
    layer.values.emplace_back(name, std::move(vals));
  }
}

// A --config file: its keys are flag names (with dashes or underscores), its values scalars or lists.
FlagLayer yaml_layer(const std::string& file) {
  FlagLayer layer{"--config " + file, {}};
  YAML::Node yaml;
  try {
    yaml = YAML::LoadFile(file);
  } catch (const YAML::Exception& e) {
    MOE_CHECK(false, "--config {}: not valid YAML: {}", file, e.what());
  }
  MOE_CHECK(yaml.IsMap() || yaml.IsNull(), "--config {}: expected a mapping of flag names to values", file);
  if (!yaml.IsMap()) return layer;
  // Conversions throw too (a key or list element that is itself a map; found by fuzz_yaml_config).
  try {
    add_yaml_values(yaml, file, layer);
  } catch (const YAML::Exception& e) {
    MOE_CHECK(false, "--config {}: {} (keys and values must be scalars, or lists of scalars)", file, e.what());
  }
  return layer;
}

}  // namespace

ParsedFlags parse_flags(const std::vector<std::string>& args) {
  CLI::App app{"moecore train: train a (MoE) GPT with Megatron-LM's flags", "moecore train"};
  std::string config_file;
  app.add_option("--config", config_file, "YAML file whose keys are these flag names")->check(CLI::ExistingFile);
  const TrainConfig defaults;
  std::map<std::string, std::vector<std::string>> values;
  std::map<std::string, bool> switches;
  std::vector<std::pair<const FlagSpec*, CLI::Option*>> options;
  for (const auto& f : flag_table()) {
    const std::string accepted = f.accepts.describe();
    // Megatron's names with an underscore (--use-checkpoint-opt_param-scheduler) also take the all-dash spelling.
    const std::string opt = "--" + f.name + (dashed(f.name) != f.name ? ",--" + dashed(f.name) : "");
    const std::string help = f.help + (accepted.empty() ? "" : " [" + accepted + "]");
    CLI::Option* o = nullptr;
    if (std::holds_alternative<bool TrainConfig::*>(f.field)) {
      o = app.add_flag(opt, switches[f.name], help);
    } else {
      const bool list = std::holds_alternative<std::vector<std::string> TrainConfig::*>(f.field);
      o = app.add_option(opt, values[f.name], help)->expected(1, list ? -1 : 1);
      o->type_name(std::holds_alternative<int64_t TrainConfig::*>(f.field)  ? "INT"
                   : std::holds_alternative<double TrainConfig::*>(f.field) ? "FLOAT"
                                                                            : "TEXT");
      if (!(f.roles & kDerived)) o->default_str(flag_value(defaults, f));  // derived ones: the help says from what
    }
    o->group(group_name(f.group));
    options.emplace_back(&f, o);
  }
  // CLI11 expands a "[a,b,c]" argument into three values; a list-expression flag takes it as one string, so its
  // value gets a leading space (whitespace is insignificant to the expression parser).
  std::vector<std::string> fixed = args;
  for (const auto& f : flag_table()) {
    if (!(f.roles & kListExpression)) continue;
    const std::string opt = "--" + f.name, opt_eq = opt + "=";
    for (size_t i = 0; i < fixed.size(); i++) {
      if (fixed[i] == opt && i + 1 < fixed.size()) fixed[i + 1] = " " + fixed[i + 1];
      if (fixed[i].rfind(opt_eq, 0) == 0) fixed[i] = opt_eq + " " + fixed[i].substr(opt_eq.size());
    }
  }
  std::vector<std::string> rev(fixed.rbegin(), fixed.rend());
  try {
    app.parse(rev);
  } catch (const CLI::CallForHelp&) {
    throw HelpRequested{app.help()};
  } catch (const CLI::ParseError& e) {
    MOE_CHECK(false, "moecore train: {} (see moecore train --help)", e.what());
  }
  ParsedFlags p;
  if (!config_file.empty()) p.yaml = yaml_layer(config_file);
  p.cli.source = "the command line";
  for (const auto& [f, o] : options) {
    if (!o->count()) continue;
    if (std::holds_alternative<bool TrainConfig::*>(f->field))
      p.cli.values.emplace_back(f->name, std::vector<std::string>{switches[f->name] ? "true" : "false"});
    else
      p.cli.values.emplace_back(f->name, values[f->name]);
  }
  return p;
}

}  // namespace moecore::train
