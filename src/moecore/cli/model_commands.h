// `moecore generate` (sample from a checkpoint) and `moecore convert` (HuggingFace <-> native checkpoints): the
// commands that use a trained model outside a training run. Not training: that is `moecore train`.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace moecore::cli {

struct GenerateArgs {
  CLI::App* cmd = nullptr;
  std::string load, tokenizer_model;
  std::string device = "auto";  // a visible GPU, else the CPU
  std::vector<std::string> prompts;
  int64_t tokens = 48, top_k = 0;
  double temperature = 0.0;
  uint64_t seed = 1234;
};
void add_generate_command(CLI::App& app, GenerateArgs& a);
// Loads the checkpoint on one process (whatever layout saved it) with the configuration it was trained with, and
// prints each prompt's continuation.
void run_generate(const GenerateArgs& a);

struct ConvertArgs {
  CLI::App *hf_to_native = nullptr, *native_to_hf = nullptr;
  std::string input, output, arch, dtype;
  int64_t max_shard_mb = 5000;
};
void add_convert_command(CLI::App& app, ConvertArgs& a);
// Returns false when neither convert subcommand was chosen.
bool run_convert(const ConvertArgs& a);

}  // namespace moecore::cli
