// `moecore generate` and `moecore convert` (see model_commands.h).
#include "moecore/cli/model_commands.h"

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>

#include "moecore/ckpt/manager.h"
#include "moecore/core/error.h"
#include "moecore/train/trainer.h"

namespace moecore::cli {

void add_generate_command(CLI::App& app, GenerateArgs& a) {
  a.cmd = app.add_subcommand("generate", "Continue prompts with a model from a checkpoint (any layout, one process)");
  a.cmd->add_option("--load", a.load, "Checkpoint root (its latest iteration) or iteration directory")->required();
  a.cmd->add_option("--prompt", a.prompts, "Text to continue (repeatable)")->required();
  a.cmd->add_option("--tokens", a.tokens, "Tokens to generate per prompt")->check(CLI::Range(int64_t{1}, int64_t{1} << 20))
      ->capture_default_str();
  a.cmd->add_option("--temperature", a.temperature, "0: greedy; otherwise sampling temperature")
      ->check(CLI::Range(0.0, 100.0))->capture_default_str();
  a.cmd->add_option("--top-k", a.top_k, "Sample among the k most likely tokens (0: all)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 30))->capture_default_str();
  a.cmd->add_option("--seed", a.seed, "Sampling seed")->capture_default_str();
  a.cmd->add_option("--tokenizer-model", a.tokenizer_model,
                    "tokenizer.json (default: the one saved in the checkpoint)");
}

void run_generate(const GenerateArgs& a) {
  const auto found = ckpt::find_checkpoint(a.load);
  MOE_CHECK(found, "--load {} holds no checkpoint (no {} and no index.json)", a.load, ckpt::kLatestFile);
  train::TrainConfig c;
  MOE_CHECK(found->state.contains("config"), "{}/{} has no configuration", found->dir, ckpt::kStateFile);
  train::apply_config_json(c, found->state["config"], found->dir + "/" + ckpt::kStateFile);
  // The trained model on one process, no data, no training; the saved layout does not matter.
  c.tensor_model_parallel_size = c.expert_model_parallel_size = c.expert_tensor_parallel_size = 1;
  c.sequence_parallel = c.use_distributed_optimizer = false;
  c.data_path.clear();
  c.mock_data = c.skip_train = true;
  c.eval_iters = c.save_interval = c.exit_interval = 0;
  c.save.clear();
  c.load = found->dir;
  c.load_hf.clear();
  c.metrics_file.clear();
  c.fault_kill_during_save.clear();
  c.generate_prompts.clear();
  c.finetune = c.moe_use_upcycling = false;
  c.no_load_optim = true;
  c.moe_upcycling_granularity = 1;
  std::string tok = a.tokenizer_model;
  if (tok.empty() && std::filesystem::exists(found->dir + "/tokenizer.json")) tok = found->dir + "/tokenizer.json";
  MOE_CHECK(!tok.empty(),
            "{} has no tokenizer.json (it was trained with --tokenizer-type {}); pass --tokenizer-model", found->dir,
            c.tokenizer_type.empty() ? "none" : c.tokenizer_type);
  c.tokenizer_type = "HuggingFaceTokenizer";
  c.tokenizer_model = tok;
  train::validate(c);
  std::FILE* null = std::fopen("/dev/null", "w");
  try {
    train::Trainer t(c, null, false, nullptr);
    fmt::print(stderr, "moecore generate: {} (iteration {}), {} sampling\n", found->dir, t.iteration(),
               a.temperature > 0 ? fmt::format("temperature {} top-k {}", a.temperature, a.top_k) : "greedy");
    for (const auto& p : a.prompts) fmt::print("{}\n", t.generate(p, a.tokens, a.temperature, a.top_k, a.seed));
  } catch (...) {
    std::fclose(null);
    throw;
  }
  std::fclose(null);
}

}  // namespace moecore::cli
