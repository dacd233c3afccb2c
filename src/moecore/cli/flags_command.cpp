// `moecore flags` (see flags_command.h).
#include "moecore/cli/flags_command.h"

#include <fmt/format.h>

#include <CLI/CLI.hpp>

#include "moecore/train/config/megatron_flags.h"

namespace moecore::cli {

void add_flags_command(CLI::App& app, FlagsArgs& a) {
  a.cmd = app.add_subcommand("flags",
                             "What moecore train does with each Megatron-LM flag (implemented, no effect, "
                             "refused) and why");
  a.cmd->add_flag("--markdown", a.markdown, "As the markdown of docs/megatron-flags.md");
}

void run_flags(const FlagsArgs& a) {
  const std::string md = train::megatron_flags_markdown();
  if (a.markdown) {
    fmt::print("{}", md);
    return;
  }
  // The table's rows as plain lines: "--flag  status: why".
  size_t pos = 0;
  while ((pos = md.find("\n| `--", pos)) != std::string::npos) {
    const size_t end = md.find('\n', pos + 1);
    const std::string row = md.substr(pos + 3, end - pos - 3);  // "`--flag` | status | why |"
    const size_t bar1 = row.find(" | "), bar2 = row.find(" | ", bar1 + 3);
    fmt::print("{:<50} {}: {}\n", row.substr(1, bar1 - 2), row.substr(bar1 + 3, bar2 - bar1 - 3),
               row.substr(bar2 + 3, row.size() - bar2 - 5));
    pos = end;
  }
}

}  // namespace moecore::cli
