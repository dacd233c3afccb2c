// `moecore bench NAME`: microbenchmarks that print achieved figures and their ratio to a roofline measured in the
// same run (the GEMM peak), because absolute times drift on shared machines. This is the registry; each
// benchmark, with its flags, is one file under cli/bench/.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <vector>

namespace moecore::cli {

// One benchmark: its subcommand (flags bound to its own arguments) and the body that runs it.
struct BenchCommand {
  CLI::App* cmd = nullptr;
  std::function<void()> run;
};

class BenchCommands {
 public:
  // Adds `bench` with one subcommand per benchmark to `app`.
  explicit BenchCommands(CLI::App& app);
  // Runs the benchmark whose subcommand was parsed; false when none was.
  bool run_parsed() const;

 private:
  std::vector<BenchCommand> benches_;
};

}  // namespace moecore::cli
