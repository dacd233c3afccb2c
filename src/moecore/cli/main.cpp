// The `moecore` program: one binary, subcommands. Errors from user input print one line and exit 1.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <functional>

#include "moecore/cli/bench.h"
#include "moecore/cli/data_commands.h"
#include "moecore/cli/model_commands.h"
#include "moecore/comm/process_group.h"
#include "moecore/core/error.h"
#include "moecore/kernels/cpu/gemm.h"
#include "moecore/train/start_config.h"
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
    fmt::print(stderr, "moecore: error: {}\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "moecore: {}\n", e.what());
    return 2;
  }
  return 0;
}

// Ends MPI if a command started it: a failure after start-up stops every rank, not just this one.
int finish_mpi(int rc) {
  if (rc != 0) {
    int inited = 0, size = 1;
    MPI_Initialized(&inited);
    if (inited) MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size > 1) MPI_Abort(MPI_COMM_WORLD, rc);
  }
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
      const moecore::comm::ProcessGroup world = moecore::comm::ProcessGroup::world();
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
  CLI::App app{"moecore: train Mixture-of-Experts language models the way Megatron-Core MoE does", "moecore"};
  app.require_subcommand(0, 1);
  bool show_version = false;
  app.add_flag("--version", show_version, "Print the version and exit");
  app.footer("Subcommands also include: train (Megatron-LM flags; moecore train --help)");

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

  CLI::App* bench = app.add_subcommand("bench", "Microbenchmarks against the GEMM roofline of this machine");
  bench->require_subcommand(1);

  int64_t gemm_size = 2048;
  int gemm_iters = 10;
  CLI::App* bgemm = bench->add_subcommand("gemm", "f32 and bf16 GEMM GFLOP/s (the roofline other benchmarks use)");
  bgemm->add_option("--size", gemm_size, "M = N = K")->check(CLI::Range(int64_t{1}, int64_t{65536}))
      ->capture_default_str();
  bgemm->add_option("--iters", gemm_iters, "Timed runs")->check(CLI::Range(1, 100000))->capture_default_str();

  moecore::cli::AttentionBenchArgs att;
  CLI::App* batt = bench->add_subcommand("attention", "Causal GQA attention forward+backward GFLOP/s vs GEMM peak");
  batt->add_option("--seq-length", att.seq, "S")->check(CLI::Range(int64_t{1}, int64_t{1} << 20))
      ->capture_default_str();
  batt->add_option("--micro-batch-size", att.batch, "B")->check(CLI::PositiveNumber)->capture_default_str();
  batt->add_option("--num-attention-heads", att.heads, "query heads")->check(CLI::PositiveNumber)
      ->capture_default_str();
  batt->add_option("--num-query-groups", att.kv_heads, "kv heads")->check(CLI::PositiveNumber)
      ->capture_default_str();
  batt->add_option("--kv-channels", att.head_dim, "head dim")->check(CLI::PositiveNumber)->capture_default_str();
  batt->add_option("--iters", att.iters, "Timed runs")->check(CLI::Range(1, 1000))->capture_default_str();
  batt->add_option("--dtype", att.dtype, "f32 (tiled kernel) or bf16 (bf16 GEMM kernel, as --bf16 trains)")
      ->check(CLI::IsMember({"f32", "bf16"}))
      ->capture_default_str();

  moecore::cli::MoEBenchArgs moeb;
  CLI::App* bmoe = bench->add_subcommand("moe-layer", "One MoE layer forward+backward GFLOP/s vs GEMM peak");
  bmoe->add_option("--tokens", moeb.tokens, "T")->check(CLI::PositiveNumber)->capture_default_str();
  bmoe->add_option("--hidden", moeb.hidden, "H")->check(CLI::PositiveNumber)->capture_default_str();
  bmoe->add_option("--ffn", moeb.ffn, "F (per expert)")->check(CLI::PositiveNumber)->capture_default_str();
  bmoe->add_option("--experts", moeb.experts, "E")->check(CLI::PositiveNumber)->capture_default_str();
  bmoe->add_option("--topk", moeb.topk, "k")->check(CLI::PositiveNumber)->capture_default_str();
  bmoe->add_option("--dtype", moeb.dtype, "f32 or bf16")->check(CLI::IsMember({"f32", "bf16"}))
      ->capture_default_str();
  bmoe->add_option("--iters", moeb.iters, "Timed runs")->check(CLI::Range(1, 1000))->capture_default_str();
  bmoe->add_flag("--moe-router-force-load-balancing", moeb.force_balance, "Route on random logits");

  moecore::cli::TrainBenchArgs trb;
  CLI::App* btrain = bench->add_subcommand("train", "MoE GPT training step: tokens/s, MFU vs GEMM peak, peak memory");
  btrain->add_option("--dtype", trb.dtype, "f32 or bf16")->check(CLI::IsMember({"f32", "bf16"}))->capture_default_str();
  btrain->add_option("--iters", trb.iters, "Timed steps")->check(CLI::Range(1, 1000))->capture_default_str();
  btrain->allow_extras();  // any other arguments are moecore train flags overriding the model, checked there
  moecore::cli::TrainBenchArgs cob;
  cob.dtype = "f32";
  cob.iters = 3;
  CLI::App* bcomm = bench->add_subcommand(
      "comm", "Under mpirun: bytes per collective vs the layout's analytic minimum; compute vs exposed communication");
  bcomm->add_option("--dtype", cob.dtype, "f32 or bf16")->check(CLI::IsMember({"f32", "bf16"}))->capture_default_str();
  bcomm->add_option("--iters", cob.iters, "Timed steps")->check(CLI::Range(1, 1000))->capture_default_str();
  bcomm->allow_extras();  // layout and model flags of moecore train

  moecore::cli::CheckpointBenchArgs ckb;
  CLI::App* bckpt = bench->add_subcommand(
      "checkpoint", "Checkpoint save/load GB/s vs a plain sequential write/read of the same bytes");
  bckpt->add_option("--dir", ckb.dir, "Scratch directory (removed afterwards)")->capture_default_str();
  bckpt->add_option("--iters", ckb.iters, "Repetitions (best is reported)")->check(CLI::Range(1, 100))
      ->capture_default_str();
  bckpt->allow_extras();  // moecore train flags overriding the model

  std::string tok_json, tok_input;
  int tok_workers = 2;
  CLI::App* btok = bench->add_subcommand("tokenizer", "Tokenizer encode MB/s on one thread and on several workers");
  btok->add_option("--tokenizer-model", tok_json, "Path to tokenizer.json")->required()->check(CLI::ExistingFile);
  btok->add_option("--input", tok_input, "Text file (default: Debian's English fortunes)")->check(CLI::ExistingFile);
  btok->add_option("--workers", tok_workers, "Worker threads")->check(CLI::Range(1, 256))->capture_default_str();

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
    } else if (bgemm->parsed()) {
      moecore::cli::run_bench_gemm(gemm_size, gemm_iters);
    } else if (batt->parsed()) {
      MOE_CHECK(att.heads % att.kv_heads == 0,
                "--num-attention-heads ({}) must be a multiple of --num-query-groups ({})", att.heads, att.kv_heads);
      moecore::cli::run_bench_attention(att);
    } else if (btok->parsed()) {
      moecore::cli::run_bench_tokenizer(tok_json, tok_input, tok_workers);
    } else if (btrain->parsed()) {
      trb.train_flags = btrain->remaining();
      moecore::cli::run_bench_train(trb);
    } else if (bckpt->parsed()) {
      ckb.train_flags = bckpt->remaining();
      moecore::cli::run_bench_checkpoint(ckb);
    } else if (bcomm->parsed()) {
      cob.train_flags = bcomm->remaining();
      moecore::cli::run_bench_comm(cob);
    } else if (bmoe->parsed()) {
      moecore::cli::run_bench_moe_layer(moeb);
    } else {
      fmt::print("{}", app.help());
    }
  });
  return finish_mpi(rc);  // benchmarks under mpirun start MPI
}
