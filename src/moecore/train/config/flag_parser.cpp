// The `moecore train` argument parser (see config.h, parse_flags): CLI11 options and YAML keys made from the flag
// table, --help grouped as the table groups them with each default; and Megatron's other flags, each with its rule
// (megatron_flags.h), taken with Megatron's arity and refused here when their rule refuses them. It returns what
// each source says and applies nothing; it reads no file but the --config YAML (presets, HF configs, checkpoints:
// start_config.cpp).
#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <map>

#include "moecore/core/error.h"
#include "moecore/train/config/config.h"
#include "moecore/train/config/megatron_flags.h"

namespace moecore::train {

namespace {

// The mapping's keys and values into `layer`, Megatron's rule flags into `megatron` (yaml-cpp conversions throw
// YAML::Exception).
void add_yaml_values(const YAML::Node& yaml, const std::string& file, FlagLayer& layer, GivenFlags& megatron) {
  for (const auto& kv : yaml) {
    const std::string key = kv.first.as<std::string>();
    std::string name = key;
    for (char& ch : name)
      if (ch == '_') ch = '-';
    if (const FlagSpec* f = find_flag(name)) name = f->name;  // the canonical spelling of a dashed alias
    const bool ruled = find_flag(name) == nullptr && find_megatron_flag(name) != nullptr && megatron_rule(name);
    MOE_CHECK(find_flag(name) != nullptr || ruled,
              "--config {}: unknown key '{}' (keys are moecore train's flag names)", file, key);
    std::vector<std::string> vals;
    if (kv.second.IsSequence()) {
      for (const auto& v : kv.second) vals.push_back(v.as<std::string>());
    } else {
      MOE_CHECK(kv.second.IsScalar(), "--config {}: '{}' must be a scalar or a list", file, key);
      vals.push_back(kv.second.as<std::string>());
    }
    if (ruled)
      give_megatron_flag(megatron, name, std::move(vals));
    else
      layer.values.emplace_back(name, std::move(vals));
  }
}

// A --config file: its keys are flag names (with dashes or underscores), its values scalars or lists.
FlagLayer yaml_layer(const std::string& file, GivenFlags& megatron) {
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
    add_yaml_values(yaml, file, layer, megatron);
  } catch (const YAML::Exception& e) {
    MOE_CHECK(false, "--config {}: {} (keys and values must be scalars, or lists of scalars)", file, e.what());
  }
  return layer;
}

// Takes Megatron's rule flags (megatron_flags.h) out of `args` into `given`, each with the values its arity takes
// as argparse would: a switch none, a one-value flag the next argument (or its --flag=value), an optional one the
// next argument unless that is a flag, a list the arguments up to the next flag. A flag given again replaces its
// earlier values (argparse keeps the last). Returns the other arguments.
std::vector<std::string> take_megatron_flags(const std::vector<std::string>& args, GivenFlags& given) {
  std::vector<std::string> rest;
  auto is_flag = [](const std::string& a) { return a.rfind("--", 0) == 0; };
  for (size_t i = 0; i < args.size(); i++) {
    const std::string& a = args[i];
    const size_t eq = a.find('=');
    const std::string name = is_flag(a) ? a.substr(2, eq == std::string::npos ? std::string::npos : eq - 2) : "";
    const MegatronFlag* f = name.empty() || find_flag(name) ? nullptr : find_megatron_flag(name);
    if (f == nullptr || megatron_rule(name) == nullptr) {
      rest.push_back(a);
      continue;
    }
    std::vector<std::string> values;
    if (eq != std::string::npos) {
      MOE_CHECK(f->arity != MegatronArity::Switch, "moecore train: --{} takes no value, got '{}'", name,
                a.substr(eq + 1));
      values.push_back(a.substr(eq + 1));
    } else if (f->arity != MegatronArity::Switch) {
      while (i + 1 < args.size() && !is_flag(args[i + 1])) {
        values.push_back(args[++i]);
        if (f->arity != MegatronArity::List) break;
      }
      MOE_CHECK(!values.empty() || f->arity == MegatronArity::Optional,
                "moecore train: --{} expects {} (see moecore flags)", name,
                f->arity == MegatronArity::List ? "one or more values" : "a value");
    }
    give_megatron_flag(given, name, std::move(values));
  }
  return rest;
}

// The flags of Megatron's inference scripts (megatron/inference/utils.py add_inference_args, which
// examples/inference/gpt/gpt_{static,dynamic}_inference.py add to Megatron's parser; pretrain_gpt.py does not).
bool inference_script_flag(const std::string& name) {
  static const char* const names[] = {"batch-boundaries",
                                      "coordinator-schedule-output-path",
                                      "drain-between-batches",
                                      "incoming-requests-duration",
                                      "incoming-requests-per-sec",
                                      "incoming-requests-per-step",
                                      "inference-ckpt-non-strict",
                                      "inference-repeat-n",
                                      "model-provider",
                                      "moe-routing-trace-max-inference-steps",
                                      "no-record-throughput",
                                      "num-tokens-from-file",
                                      "num-tokens-to-generate",
                                      "num-tokens-to-prompt",
                                      "output-every-n-results",
                                      "output-path",
                                      "output-request-events",
                                      "prompt-file",
                                      "prompt-file-num-truncate",
                                      "prompts",
                                      "return-log-probs",
                                      "skip-prompt-log-probs",
                                      "stop-words",
                                      "suspend-resume-interval",
                                      "suspend-timeout",
                                      "temperature",
                                      "termination-id",
                                      "throughput-check-only",
                                      "top-n-logprobs",
                                      "top_k",
                                      "top_p",
                                      "use-flashinfer-fused-rope"};
  return std::find(std::begin(names), std::end(names), name) != std::end(names);
}

// NVIDIA ModelOpt's flags (megatron/post_training/arguments.py add_modelopt_args), which pretrain_gpt.py adds to
// its parser only when modelopt is installed (GPT-OSS's --enable-gpt-oss among them).
bool modelopt_flag(const std::string& name) {
  static const char* const names[] = {"enable-gpt-oss",
                                      "export-default-te-spec",
                                      "export-force-local-attention",
                                      "export-kd-cfg",
                                      "export-kd-teacher-ckpt-format",
                                      "export-kd-teacher-load",
                                      "export-kd-teacher-model-config",
                                      "export-kv-cache-quant",
                                      "export-legacy-megatron",
                                      "export-model-type",
                                      "export-moe-apply-probs-on-input",
                                      "export-offline-model",
                                      "export-qk-l2-norm",
                                      "export-quant-cfg",
                                      "export-real-quant-cfg",
                                      "export-te-mcore-model",
                                      "finetune-data-files",
                                      "finetune-data-split",
                                      "finetune-hf-dataset",
                                      "freeze-base-for-mtp",
                                      "modelopt-enabled",
                                      "qad-train-target"};
  return std::find(std::begin(names), std::end(names), name) != std::end(names);
}

// A flag neither in the table nor Megatron's (those were taken out before), named in the order given: CLI11 would
// list the leftover arguments reversed, values and all.
void refuse_unknown_flags(const std::vector<std::string>& rest) {
  for (const std::string& a : rest) {
    if (a.rfind("--", 0) != 0 || a == "--") continue;
    const std::string name = a.substr(2, a.find('=') == std::string::npos ? std::string::npos : a.find('=') - 2);
    if (find_flag(name) || name == "config" || name == "help") continue;
    MOE_CHECK(!inference_script_flag(name),
              "moecore train: --{} is a flag of Megatron's inference scripts (megatron/inference/utils.py, "
              "examples/inference/gpt/), not of its training (pretrain_gpt.py): moecore train trains; to continue "
              "prompts with a trained checkpoint run `moecore generate --load DIR --prompt TEXT`",
              name);
    MOE_CHECK(!modelopt_flag(name),
              "moecore train: --{} is a flag of NVIDIA ModelOpt (megatron/post_training/arguments.py), which "
              "pretrain_gpt.py takes only with modelopt installed: ModelOpt's export, quantization, distillation and "
              "GPT-OSS modes are not supported by moecore; drop the flag",
              name);
    MOE_CHECK(false,
              "moecore train: unknown flag --{}: neither moecore's nor one of Megatron-LM's pretrain_gpt.py (see "
              "moecore train --help and moecore flags)",
              name);
  }
}

}  // namespace

ParsedFlags parse_flags(const std::vector<std::string>& args) {
  CLI::App app{"moecore train: train a (MoE) GPT with Megatron-LM's flags", "moecore train"};
  std::string config_file;
  // Every option given twice keeps its last value, as argparse does (a launch script's base line, then overrides).
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_option("--config", config_file, "YAML file whose keys are these flag names")->check(CLI::ExistingFile);
  const TrainConfig defaults;
  std::map<std::string, std::vector<std::string>> values;
  // A list flag's values per occurrence (CLI11 separates occurrences for a vector of vectors): the last one counts,
  // as with argparse's nargs='+'.
  std::map<std::string, std::vector<std::vector<std::string>>> lists;
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
      if (std::holds_alternative<std::vector<std::string> TrainConfig::*>(f.field))
        o = app.add_option(opt, lists[f.name], help)->expected(1, -1);
      else
        o = app.add_option(opt, values[f.name], help)->expected(1);
      o->type_name(std::holds_alternative<int64_t TrainConfig::*>(f.field)  ? "INT"
                   : std::holds_alternative<double TrainConfig::*>(f.field) ? "FLOAT"
                                                                            : "TEXT");
      if (!(f.roles & kDerived)) o->default_str(flag_value(defaults, f));  // derived ones: the help says from what
    }
    o->group(group_name(f.group));
    options.emplace_back(&f, o);
  }
  // Megatron's flags without a table row are taken out before CLI11 sees the arguments (800 more CLI11 options
  // would make every parse slow); --help names them in its footer only (moecore flags lists each with its rule).
  GivenFlags megatron_cli;
  const std::vector<std::string> rest = take_megatron_flags(args, megatron_cli);
  int no_effect = 0, refused = 0;
  for (const MegatronFlag* f : megatron_ruled_flags())
    (megatron_rule(f->name)->kind == RuleKind::Refused ? refused : no_effect)++;
  app.footer(
      fmt::format("Megatron-LM's other flags are accepted too: {} without effect here (listed at the start of "
                  "the run), {} refused here with the reason. `moecore flags` lists each with its rule "
                  "(docs/megatron-flags.md).\n",
                  no_effect, refused));
  // CLI11 expands a "[a,b,c]" argument into three values; a list-expression flag takes it as one string, so its
  // value gets a leading space (whitespace is insignificant to the expression parser).
  std::vector<std::string> fixed = rest;
  for (const auto& f : flag_table()) {
    if (!(f.roles & kListExpression)) continue;
    const std::string opt = "--" + f.name, opt_eq = opt + "=";
    for (size_t i = 0; i < fixed.size(); i++) {
      if (fixed[i] == opt && i + 1 < fixed.size()) fixed[i + 1] = " " + fixed[i + 1];
      if (fixed[i].rfind(opt_eq, 0) == 0) fixed[i] = opt_eq + " " + fixed[i].substr(opt_eq.size());
    }
  }
  refuse_unknown_flags(rest);
  std::vector<std::string> rev(fixed.rbegin(), fixed.rend());
  try {
    app.parse(rev);
  } catch (const CLI::CallForHelp&) {
    throw HelpRequested{app.help()};
  } catch (const CLI::ParseError& e) {
    MOE_CHECK(false, "moecore train: {} (see moecore train --help)", e.what());
  }
  ParsedFlags p;
  if (!config_file.empty()) p.yaml = yaml_layer(config_file, p.megatron);
  p.cli.source = "the command line";
  for (const auto& [f, o] : options) {
    if (!o->count()) continue;
    if (std::holds_alternative<bool TrainConfig::*>(f->field))
      p.cli.values.emplace_back(f->name, std::vector<std::string>{switches[f->name] ? "true" : "false"});
    else if (lists.count(f->name))
      p.cli.values.emplace_back(f->name, lists[f->name].back());
    else
      p.cli.values.emplace_back(f->name, values[f->name]);
  }
  // The command line's Megatron flags over the YAML's, as its table flags are.
  for (auto& [name, vals] : megatron_cli) give_megatron_flag(p.megatron, name, std::move(vals));
  check_megatron_flags(p.megatron);  // refused before any work, identically on every rank
  return p;
}

}  // namespace moecore::train
