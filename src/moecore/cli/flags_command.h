// `moecore flags`: what `moecore train` does with each Megatron-LM flag (implemented, no effect, refused) and why;
// with --markdown, docs/megatron-flags.md. The rules themselves: train/megatron_flags.h.
#pragma once

namespace CLI {
class App;
}

namespace moecore::cli {

struct FlagsArgs {
  CLI::App* cmd = nullptr;
  bool markdown = false;
};
void add_flags_command(CLI::App& app, FlagsArgs& a);
void run_flags(const FlagsArgs& a);

}  // namespace moecore::cli
