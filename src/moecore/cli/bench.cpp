// The benchmark registry (see bench.h): the `bench` subcommand and its benchmarks, in help order.
#include "moecore/cli/bench.h"

#include <cstdlib>
#include <string>

#include "moecore/cli/bench/bench_util.h"
#include "moecore/cli/bench/benches.h"

namespace moecore::cli {

BenchCommands::BenchCommands(CLI::App& app) {
  CLI::App* bench = app.add_subcommand("bench", "Microbenchmarks against the GEMM roofline of this machine");
  bench->require_subcommand(1);
  for (auto add : {add_gemm_bench, add_attention_bench, add_moe_layer_bench, add_train_bench, add_comm_bench,
                   add_checkpoint_bench, add_tokenizer_bench, add_pipeline_bench, add_context_bench, add_memory_bench,
                   add_mla_bench, add_plan_bench, add_grouped_gemm_bench})
    benches_.push_back(add(*bench));
}

bool BenchCommands::run_parsed() const {
  for (const auto& b : benches_)
    if (b.cmd->parsed()) {
      if (!std::getenv("OMPI_COMM_WORLD_RANK") || std::string(std::getenv("OMPI_COMM_WORLD_RANK")) == "0")
        print_machine();  // once per run, before the benchmark's own lines
      b.run();
      return true;
    }
  return false;
}

}  // namespace moecore::cli
