// Where a training run's configuration comes from, lowest layer first: TrainConfig's defaults < the --model preset
// < the --load-hf model's config.json (its architecture and tokenizer) < the --config YAML < the command line;
// --use-checkpoint-args then puts the checkpoint's model flags on top. The parser (parse_flags) reads only the YAML;
// the HF config.json and the checkpoint's train_state.json are read here.
#pragma once

#include <string>
#include <vector>

#include "moecore/train/config/config.h"

namespace moecore::train {

// The layers composed and resolved (resolve_defaults, validate): the configuration a Trainer takes. `plan_only`:
// for `moecore plan`, which assumes the GPU --device names (TrainConfig::plan_only).
TrainConfig compose_train_config(const ParsedFlags& flags, bool plan_only = false);
// `moecore train` arguments (argv after "train") to a resolved configuration: parse_flags, then
// compose_train_config. Throws Error naming the flag for anything unknown, conflicting or unsupported.
TrainConfig parse_train_config(const std::vector<std::string>& args);

// The HF layer: the architecture flags of `hf_dir`/config.json, and its tokenizer.json when there is one.
void apply_hf_config(TrainConfig& c, const std::string& hf_dir);
// The checkpoint layer: the checkpoint-arg flags (kCheckpointArg) the checkpoint in c.load was saved with.
void apply_checkpoint_args(TrainConfig& c);

}  // namespace moecore::train
