// The layers of a training configuration composed (see start_config.h).
#include "moecore/train/config/start_config.h"

#include <filesystem>
#include <fstream>

#include "moecore/ckpt/hf.h"
#include "moecore/ckpt/manager.h"
#include "moecore/core/error.h"
#include "moecore/train/config/megatron_flags.h"
#include "moecore/train/config/presets.h"

namespace moecore::train {

void apply_hf_config(TrainConfig& c, const std::string& hf_dir) {
  const std::string cfg = hf_dir + "/config.json";
  MOE_CHECK(std::filesystem::exists(cfg), "--load-hf {}: no config.json there (a HuggingFace model directory?)",
            hf_dir);
  std::ifstream in(cfg);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    MOE_CHECK(false, "{} is not valid JSON ({})", cfg, e.what());
  }
  apply_config_json(c, ckpt::hf_train_flags(j, cfg), cfg);
  if (std::filesystem::exists(hf_dir + "/tokenizer.json")) {
    c.tokenizer_type = "HuggingFaceTokenizer";
    c.tokenizer_model = hf_dir;
  }
}

void apply_checkpoint_args(TrainConfig& c) {  // Megatron's --use-checkpoint-args: the checkpoint's model flags win
  MOE_CHECK(!c.load.empty(), "--use-checkpoint-args needs --load");
  const auto found = ckpt::find_checkpoint(c.load, c.ckpt_step);
  MOE_CHECK(found, "--use-checkpoint-args: --load {} holds no checkpoint", c.load);
  const auto& saved = found->state.at("config");
  nlohmann::json model = nlohmann::json::object();
  for (const auto& k : flag_names(kCheckpointArg))
    if (saved.contains(k)) model[k] = saved[k];
  apply_config_json(c, model, found->dir + "/" + ckpt::kStateFile);
}

TrainConfig compose_train_config(const ParsedFlags& flags, bool plan_only) {
  TrainConfig given;  // what the YAML and the command line say: which preset and HF model lie under them
  apply_flags(given, flags.yaml);
  apply_flags(given, flags.cli);
  TrainConfig c;
  if (!given.model.empty()) apply_preset(given.model, c);
  if (!given.load_hf.empty()) apply_hf_config(c, given.load_hf);
  apply_flags(c, flags.yaml);
  apply_flags(c, flags.cli);
  if (c.use_checkpoint_args) apply_checkpoint_args(c);
  // pretrain_gpt.py's default tokenizer: GPT2BPETokenizer, here when its files are given.
  if (c.tokenizer_type.empty() && (!c.vocab_file.empty() || !c.merge_file.empty()))
    c.tokenizer_type = "GPT2BPETokenizer";
  c.no_effect = megatron_no_effect_lines(flags.megatron);
  c.plan_only = plan_only;
  resolve(c);
  return c;
}

TrainConfig parse_train_config(const std::vector<std::string>& args) {
  return compose_train_config(parse_flags(args));
}

}  // namespace moecore::train
