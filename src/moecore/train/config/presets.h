// Model presets for --model: the architecture of a scaled-down Mixtral, Qwen3-MoE, OLMoE or DeepSeek-V3 (and the
// tiny-moe demo, with its training schedule). A preset is the lowest layer of a configuration: an HF config.json,
// the --config YAML and flags override every value it sets.
#pragma once

#include <string>
#include <vector>

#include "moecore/train/config/config.h"

namespace moecore::train {

// Preset names, in the order --help lists them.
std::vector<std::string> preset_names();
// Sets the preset's fields of `c`; throws Error naming the presets for an unknown name.
void apply_preset(const std::string& name, TrainConfig& c);

}  // namespace moecore::train
