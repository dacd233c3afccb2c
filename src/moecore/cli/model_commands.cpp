// `moecore generate` and `moecore convert` (see model_commands.h).
#include "moecore/cli/model_commands.h"

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>

#include "moecore/ckpt/hf.h"
#include "moecore/ckpt/manager.h"
#include "moecore/core/error.h"
#include "moecore/device/device_select.h"
#include "moecore/train/generate.h"

namespace moecore::cli {

void add_generate_command(CLI::App& app, GenerateArgs& a) {
  a.cmd = app.add_subcommand("generate", "Continue prompts with a model from a checkpoint (any layout, one process)");
  a.cmd->add_option("--load", a.load, "Checkpoint root (its latest iteration) or iteration directory")->required();
  a.cmd->add_option("--prompt", a.prompts, "Text to continue (repeatable)")->required();
  a.cmd->add_option("--tokens", a.tokens, "Tokens to generate per prompt")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20))
      ->capture_default_str();
  a.cmd->add_option("--temperature", a.temperature, "0: greedy; otherwise sampling temperature")
      ->check(CLI::Range(0.0, 100.0))
      ->capture_default_str();
  a.cmd->add_option("--top-k", a.top_k, "Sample among the k most likely tokens (0: all)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 30))
      ->capture_default_str();
  a.cmd->add_option("--seed", a.seed, "Sampling seed")->capture_default_str();
  a.cmd->add_option("--tokenizer-model", a.tokenizer_model,
                    "tokenizer.json (default: the one saved in the checkpoint)");
  a.cmd->add_option("--device", a.device, "auto (a visible GPU, else the CPU), cpu or cuda (docs/cuda.md)")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))
      ->capture_default_str();
}

void run_generate(const GenerateArgs& a) {
  const Device device = device::resolve_device(a.device, "generate");
  train::CheckpointModel m(a.load, a.tokenizer_model, device);
  fmt::print(stderr, "moecore generate: {} (iteration {}) on {}, {} sampling\n", m.dir(), m.iteration(), device.str(),
             a.temperature > 0 ? fmt::format("temperature {} top-k {}", a.temperature, a.top_k) : "greedy");
  for (const auto& p : a.prompts) fmt::print("{}\n", m.generate(p, {a.tokens, a.temperature, a.top_k, a.seed}));
}

void add_convert_command(CLI::App& app, ConvertArgs& a) {
  CLI::App* conv =
      app.add_subcommand("convert", "HuggingFace <-> native checkpoints (Qwen3-MoE, Mixtral, DeepSeek-V3/Kimi-K2)");
  conv->require_subcommand(1);
  a.hf_to_native = conv->add_subcommand("hf-to-native", "HF model directory -> native checkpoint (--load it)");
  a.native_to_hf = conv->add_subcommand("native-to-hf", "Native checkpoint -> HF model directory");
  for (CLI::App* c : {a.hf_to_native, a.native_to_hf}) {
    c->add_option("--input", a.input, "Source directory")->required();
    c->add_option("--output", a.output, "Destination directory")->required();
  }
  a.native_to_hf
      ->add_option("--arch", a.arch,
                   "qwen3-moe, mixtral or deepseek-v3 (default: the source HF model's, else deepseek-v3 "
                   "with multi-latent attention, qwen3-moe with qk-layernorm and mixtral without)")
      ->check(CLI::IsMember({"qwen3-moe", "mixtral", "deepseek-v3"}));
  a.native_to_hf->add_option("--dtype", a.dtype, "bf16 or f32 (default: the source HF model's torch_dtype, else bf16)")
      ->check(CLI::IsMember({"bf16", "f32"}));
  a.native_to_hf->add_option("--max-shard-size-mb", a.max_shard_mb, "Largest safetensors shard")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 30))
      ->capture_default_str();
}

bool run_convert(const ConvertArgs& a) {
  if (a.hf_to_native->parsed()) {
    const int64_t n = ckpt::convert_hf_to_native(a.input, a.output);
    fmt::print(
        "converted {} -> {}: {} tensors (release checkpoint; moecore train --load {} "
        "--use-checkpoint-args, or moecore generate --load {})\n",
        a.input, ckpt::iteration_dir(a.output, -1), n, a.output, a.output);
    return true;
  }
  if (a.native_to_hf->parsed()) {
    const std::string kind = a.arch == "qwen3-moe" ? "qwen3_moe" : a.arch == "deepseek-v3" ? "deepseek_v3" : a.arch;
    const int64_t n = ckpt::convert_native_to_hf(a.input, a.output, kind, a.dtype, a.max_shard_mb << 20);
    fmt::print("converted {} -> {}: {} HF tensors with config.json and model.safetensors.index.json\n", a.input,
               a.output, n);
    return true;
  }
  return false;
}

}  // namespace moecore::cli
