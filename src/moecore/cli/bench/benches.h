// The benchmarks the registry (cli/bench.h) adds, one file each: every function adds its subcommand under
// `bench`, binds the flags, and returns the subcommand with the body that runs it.
#pragma once

#include "moecore/cli/bench.h"

namespace moecore::cli {

BenchCommand add_gemm_bench(CLI::App& bench);        // gemm.cpp
BenchCommand add_attention_bench(CLI::App& bench);   // attention.cpp
BenchCommand add_moe_layer_bench(CLI::App& bench);   // moe_layer.cpp
BenchCommand add_train_bench(CLI::App& bench);       // train.cpp
BenchCommand add_comm_bench(CLI::App& bench);        // comm.cpp
BenchCommand add_checkpoint_bench(CLI::App& bench);  // checkpoint.cpp
BenchCommand add_tokenizer_bench(CLI::App& bench);   // tokenizer.cpp
BenchCommand add_pipeline_bench(CLI::App& bench);    // pipeline.cpp
BenchCommand add_context_bench(CLI::App& bench);     // context.cpp
BenchCommand add_memory_bench(CLI::App& bench);      // memory.cpp
BenchCommand add_mla_bench(CLI::App& bench);         // mla.cpp
BenchCommand add_plan_bench(CLI::App& bench);        // plan.cpp

BenchCommand add_grouped_gemm_bench(CLI::App& bench);  // grouped_gemm.cpp (GPU only)

}  // namespace moecore::cli
