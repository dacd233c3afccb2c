// The `moecore` program: one binary, subcommands. Errors from user input print one line and exit 1.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <functional>
#include <new>

#include "moecore/cli/bench.h"
#include "moecore/cli/data_commands.h"
#include "moecore/cli/flags_command.h"
#include "moecore/cli/launch_command.h"
#include "moecore/cli/model_commands.h"
#include "moecore/cli/plan_command.h"
#include "moecore/cli/report_command.h"
#include "moecore/comm/process_group.h"
#include "moecore/core/error.h"
#include "moecore/kernels/gemm.h"
#include "moecore/train/config/megatron_flags.h"
#include "moecore/train/config/start_config.h"
#include "moecore/train/rank_agreement.h"
#include "moecore/train/run_control.h"
#include "moecore/train/trainer.h"

namespace {

std::string version_line() {
  return fmt::format("moecore {} (CPU backend: oneDNN GEMM, OpenMP; bf16 GEMM {})", MOECORE_VERSION,
                     moecore::kernels::gemm_stats().bf16_native ? "native" : "widened to f32 on this CPU");
}

}  // namespace

// Runs a command body: a user error prints one line and exits 1, an internal error exits 2.
int guarded(const std::function<void()>& body) {
  try {
    body();
  } catch (const moecore::Error& e) {
    std::fflush(stdout);  // what was logged comes before the error
    fmt::print(stderr, "moecore: error: {}\n", e.what());
    return 1;
  } catch (const std::bad_alloc& e) {  // an allocation outside the caching allocator: a message, not a signal
    fmt::print(stderr,
               "moecore: error: out of memory ({}); reduce --micro-batch-size, --seq-length or the model size, or "
               "spread it over more ranks\n",
               e.what());
    return 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "moecore: {}\n", e.what());
    return 2;
  }
  return 0;
}

// A command body that returns its own exit status; user errors as in guarded().
int guarded_status(const std::function<int()>& body) {
  int status = 0;
  const int rc = guarded([&] { status = body(); });
  return rc != 0 ? rc : status;
}

// Ends MPI if a command started it: a failure after start-up stops every rank, not just this one.
int finish_mpi(int rc) {
  if (rc != 0) moecore::comm::ProcessGroup::abort_job_if_shared(rc);
  moecore::comm::ProcessGroup::finalize();
  return rc;
}

// `moecore train ...` takes Megatron's flags, parsed by train/config (one table for flags and YAML keys).
// Under mpirun every rank runs this; a single process needs no mpirun. Configuration errors are found before MPI
// starts, identically on every rank, so all ranks exit with the same message and none waits for the others.
int run_train(int argc, char** argv) {
  const int rc = guarded([&] {
    try {
      const auto cfg = moecore::train::parse_train_config(std::vector<std::string>(argv + 2, argv + argc));
      moecore::comm::ProcessGroup::init(&argc, &argv);
      moecore::train::configure_collective_timeout(cfg);  // --distributed-timeout-minutes, before any collective
      const moecore::comm::ProcessGroup world = moecore::comm::ProcessGroup::world();
      moecore::train::check_ranks_agree(cfg, world);  // before any other collective: same flags, data, checkpoint
      if (world.rank() == 0) fmt::print("{}", moecore::train::describe_no_effect(cfg.no_effect));
      moecore::train::Trainer trainer(cfg, stdout, true, &world);
      trainer.run();
    } catch (const moecore::train::HelpRequested& h) {
      fmt::print("{}", h.text);
    }
  });
  return finish_mpi(rc);
}

int main(int argc, char** argv) {
  if (argc >= 2 && std::string(argv[1]) == "train") return run_train(argc, argv);
  if (argc >= 2 && std::string(argv[1]) == "plan")  // the train flags, no MPI, nothing trained
    return guarded_status([&] {
      try {
        return moecore::cli::run_plan(std::vector<std::string>(argv + 2, argv + argc), stdout);
      } catch (const moecore::train::HelpRequested& h) {
        fmt::print("{}", h.text);
        return 0;
      }
    });
  if (argc >= 2 && std::string(argv[1]) == "launch")
    return guarded_status([&] { return moecore::cli::run_launch(argc, argv); });
  CLI::App app{"moecore: train Mixture-of-Experts language models the way Megatron-Core MoE does", "moecore"};
  app.require_subcommand(0, 1);
  bool show_version = false;
  app.add_flag("--version", show_version, "Print the version and exit");
  app.footer(
      "Subcommands also include: train (Megatron-LM flags; moecore train --help), plan (the memory plan of train "
      "flags without running: moecore plan --world-size N --device-memory-gib G <train flags>; with --plan-gpu "
      "h100|h200|b200|gb200 the predicted step time and TFLOPS, with --search the fastest layouts that fit), launch "
      "(mpirun with "
      "graceful "
      "SIGTERM/SIGINT: moecore launch --nproc-per-node N -- train ...)");

  moecore::cli::PreprocessArgs pre;
  moecore::cli::add_preprocess_command(app, pre);
  moecore::cli::TrainTokenizerArgs ttok;
  moecore::cli::add_train_tokenizer_command(app, ttok);
  moecore::cli::CorpusArgs corpus;
  moecore::cli::add_corpus_command(app, corpus);
  moecore::cli::GenerateArgs gen;
  moecore::cli::add_generate_command(app, gen);
  moecore::cli::ConvertArgs conv;
  moecore::cli::add_convert_command(app, conv);

  moecore::cli::FlagsArgs flags;
  moecore::cli::add_flags_command(app, flags);
  moecore::cli::ReportArgs report;
  moecore::cli::add_report_command(app, report);

  const moecore::cli::BenchCommands benches(app);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }

  const int rc = guarded([&] {
    if (show_version) {
      fmt::print("{}\n", version_line());
      return;
    }
    if (pre.cmd->parsed()) {
      moecore::cli::run_preprocess(pre);
    } else if (corpus.cmd->parsed()) {
      moecore::cli::run_corpus(corpus);
    } else if (moecore::cli::run_convert(conv)) {
    } else if (gen.cmd->parsed()) {
      moecore::cli::run_generate(gen);
    } else if (ttok.cmd->parsed()) {
      moecore::cli::run_train_tokenizer(ttok);
    } else if (flags.cmd->parsed()) {
      moecore::cli::run_flags(flags);
    } else if (report.cmd->parsed()) {
      moecore::cli::run_report(report);
    } else if (benches.run_parsed()) {
    } else {
      fmt::print("{}", app.help());
    }
  });
  return finish_mpi(rc);  // benchmarks under mpirun start MPI
}
