// Training configuration (see config.h). One table lists every flag once; the command line (CLI11), the YAML
// file (yaml-cpp), the presets and the printed configuration all go through it.
#include "moecore/train/config.h"

#include <algorithm>

#include <yaml-cpp/yaml.h>

#include <CLI/CLI.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>

#include "moecore/ckpt/hf.h"
#include "moecore/ckpt/manager.h"
#include "moecore/core/error.h"

namespace moecore::train {

namespace {

enum class Kind { Int, Double, Bool, String, List };

struct Flag {
  std::string name;  // without leading dashes
  Kind kind;
  void* field;
  std::string help;
};

std::vector<Flag> flag_table(TrainConfig& c) {
  return {
      {"model", Kind::String, &c.model, "Preset: tiny-moe, mixtral, qwen3-moe, olmoe, deepseek-v3 (flags override)"},
      {"num-layers", Kind::Int, &c.num_layers, "Transformer layers"},
      {"hidden-size", Kind::Int, &c.hidden_size, "Hidden size H"},
      {"ffn-hidden-size", Kind::Int, &c.ffn_hidden_size, "Dense FFN size (default 4H; 8H/3 rounded to 64 with --swiglu)"},
      {"num-attention-heads", Kind::Int, &c.num_attention_heads, "Query heads"},
      {"group-query-attention", Kind::Bool, &c.group_query_attention, "Use --num-query-groups key/value heads"},
      {"num-query-groups", Kind::Int, &c.num_query_groups, "Key/value heads with --group-query-attention"},
      {"kv-channels", Kind::Int, &c.kv_channels, "Head dimension (default H / heads)"},
      {"qk-layernorm", Kind::Bool, &c.qk_layernorm, "RMSNorm on each query and key head (Qwen3, OLMoE)"},
      {"seq-length", Kind::Int, &c.seq_length, "Sequence length"},
      {"max-position-embeddings", Kind::Int, &c.max_position_embeddings, "Longest position (default --seq-length)"},
      {"rotary-base", Kind::Double, &c.rotary_base, "RoPE base"},
      {"rotary-percent", Kind::Double, &c.rotary_percent, "Fraction of each head rotated"},
      {"position-embedding-type", Kind::String, &c.position_embedding_type, "rope (the only one implemented)"},
      {"normalization", Kind::String, &c.normalization, "RMSNorm (the only one implemented)"},
      {"norm-epsilon", Kind::Double, &c.norm_epsilon, "RMSNorm epsilon"},
      {"untie-embeddings-and-output-weights", Kind::Bool, &c.untie_embeddings_and_output_weights,
       "Separate output layer"},
      {"swiglu", Kind::Bool, &c.swiglu, "SwiGLU FFNs (default GeLU)"},
      {"squared-relu", Kind::Bool, &c.squared_relu, "Squared-ReLU FFNs"},
      {"disable-bias-linear", Kind::Bool, &c.disable_bias_linear, "No biases in linear layers (required for MoE)"},
      {"init-method-std", Kind::Double, &c.init_method_std, "Std of the normal weight init"},
      {"make-vocab-size-divisible-by", Kind::Int, &c.make_vocab_size_divisible_by, "Pad the vocabulary to a multiple"},
      {"num-experts", Kind::Int, &c.num_experts, "Routed experts per MoE layer (0: dense)"},
      {"moe-ffn-hidden-size", Kind::Int, &c.moe_ffn_hidden_size, "Expert FFN size (default --ffn-hidden-size)"},
      {"moe-router-topk", Kind::Int, &c.moe_router_topk, "Experts per token"},
      {"moe-router-score-function", Kind::String, &c.moe_router_score_function, "softmax or sigmoid"},
      {"moe-router-pre-softmax", Kind::Bool, &c.moe_router_pre_softmax, "Softmax over all experts before top-k"},
      {"moe-router-topk-scaling-factor", Kind::Double, &c.moe_router_topk_scaling_factor, "Scale routing probs"},
      {"moe-router-num-groups", Kind::Int, &c.moe_router_num_groups, "Expert groups for group-limited routing"},
      {"moe-router-group-topk", Kind::Int, &c.moe_router_group_topk, "Groups each token may use"},
      {"moe-router-enable-expert-bias", Kind::Bool, &c.moe_router_enable_expert_bias, "Aux-loss-free balancing"},
      {"moe-router-bias-update-rate", Kind::Double, &c.moe_router_bias_update_rate, "Expert-bias step per batch"},
      {"moe-router-load-balancing-type", Kind::List, &c.moe_router_load_balancing_type,
       "aux_loss, seq_aux_loss, global_aux_loss, none (a list)"},
      {"moe-aux-loss-coeff", Kind::List, &c.moe_aux_loss_coeff, "One coefficient per load-balancing type"},
      {"moe-z-loss-coeff", Kind::Double, &c.moe_z_loss_coeff, "Router z-loss coefficient"},
      {"moe-input-jitter-eps", Kind::Double, &c.moe_input_jitter_eps, "Multiplicative router input jitter"},
      {"moe-router-force-load-balancing", Kind::Bool, &c.moe_router_force_load_balancing, "Route on noise (bench)"},
      {"moe-router-dtype", Kind::String, &c.moe_router_dtype, "fp32 or fp64"},
      {"moe-expert-capacity-factor", Kind::Double, &c.moe_expert_capacity_factor, "Capacity factor (<0: dropless)"},
      {"moe-token-drop-policy", Kind::String, &c.moe_token_drop_policy, "probs or position"},
      {"moe-pad-expert-input-to-capacity", Kind::Bool, &c.moe_pad_expert_input_to_capacity, "Pad to capacity"},
      {"moe-shared-expert-intermediate-size", Kind::Int, &c.moe_shared_expert_intermediate_size, "Shared expert size"},
      {"moe-shared-expert-gate", Kind::Bool, &c.moe_shared_expert_gate, "Sigmoid gate on the shared expert"},
      {"moe-layer-freq", Kind::String, &c.moe_layer_freq, "N or a list such as ([0]*1+[1]*3)"},
      {"moe-grouped-gemm", Kind::Bool, &c.moe_grouped_gemm, "Grouped GEMM experts (always on in moecore)"},
      {"moe-token-dispatcher-type", Kind::String, &c.moe_token_dispatcher_type,
       "alltoall or allgather (one rank: local dispatch either way)"},
      {"moe-per-layer-logging", Kind::Bool, &c.moe_per_layer_logging, "Log each MoE layer's losses and load"},
      {"micro-batch-size", Kind::Int, &c.micro_batch_size, "Sequences per micro-batch"},
      {"global-batch-size", Kind::Int, &c.global_batch_size, "Sequences per step (default micro x DP)"},
      {"train-iters", Kind::Int, &c.train_iters, "Optimizer steps"},
      {"lr", Kind::Double, &c.lr, "Peak learning rate"},
      {"min-lr", Kind::Double, &c.min_lr, "Final learning rate"},
      {"lr-decay-style", Kind::String, &c.lr_decay_style, "constant, linear, cosine or WSD"},
      {"lr-wsd-decay-style", Kind::String, &c.lr_wsd_decay_style, "WSD anneal: linear, cosine, exponential, minus_sqrt"},
      {"lr-warmup-iters", Kind::Int, &c.lr_warmup_iters, "Linear warmup steps"},
      {"lr-decay-iters", Kind::Int, &c.lr_decay_iters, "Decay steps (default --train-iters)"},
      {"lr-wsd-decay-iters", Kind::Int, &c.lr_wsd_decay_iters, "WSD anneal steps"},
      {"weight-decay", Kind::Double, &c.weight_decay, "AdamW weight decay (not on norms and biases)"},
      {"clip-grad", Kind::Double, &c.clip_grad, "Global gradient-norm clip (0: off)"},
      {"adam-beta1", Kind::Double, &c.adam_beta1, "Adam beta1"},
      {"adam-beta2", Kind::Double, &c.adam_beta2, "Adam beta2"},
      {"adam-eps", Kind::Double, &c.adam_eps, "Adam epsilon"},
      {"optimizer", Kind::String, &c.optimizer, "adam (AdamW)"},
      {"seed", Kind::Int, &c.seed, "Random seed"},
      {"bf16", Kind::Bool, &c.bf16, "bf16 GEMMs with fp32 master weights and accumulation"},
      {"tensor-model-parallel-size", Kind::Int, &c.tensor_model_parallel_size, "TP"},
      {"pipeline-model-parallel-size", Kind::Int, &c.pipeline_model_parallel_size, "PP"},
      {"context-parallel-size", Kind::Int, &c.context_parallel_size, "CP"},
      {"expert-model-parallel-size", Kind::Int, &c.expert_model_parallel_size, "EP"},
      {"expert-tensor-parallel-size", Kind::Int, &c.expert_tensor_parallel_size, "ETP (default TP)"},
      {"sequence-parallel", Kind::Bool, &c.sequence_parallel, "Sequence parallelism (with TP)"},
      {"use-distributed-optimizer", Kind::Bool, &c.use_distributed_optimizer,
       "Shard fp32 master weights and Adam moments over DPxCP (dense) and EDP (experts)"},
      {"data-path", Kind::List, &c.data_path, "Dataset prefix, or weight/prefix pairs"},
      {"split", Kind::String, &c.split, "train,valid,test proportions"},
      {"mock-data", Kind::Bool, &c.mock_data, "Synthetic tokens instead of --data-path"},
      {"tokenizer-type", Kind::String, &c.tokenizer_type, "HuggingFaceTokenizer or NullTokenizer"},
      {"tokenizer-model", Kind::String, &c.tokenizer_model, "tokenizer.json or its directory"},
      {"vocab-size", Kind::Int, &c.vocab_size, "Vocabulary with NullTokenizer or --mock-data"},
      {"eval-interval", Kind::Int, &c.eval_interval, "Steps between validations"},
      {"eval-iters", Kind::Int, &c.eval_iters, "Global batches per validation"},
      {"log-interval", Kind::Int, &c.log_interval, "Steps between log lines"},
      {"skip-train", Kind::Bool, &c.skip_train, "Only evaluate"},
      {"metrics-file", Kind::String, &c.metrics_file, "JSON lines of logged metrics"},
      {"generate-prompts", Kind::List, &c.generate_prompts, "Prompts to sample from after training"},
      {"generate-tokens", Kind::Int, &c.generate_tokens, "Tokens to sample per prompt"},
      {"generate-top-k", Kind::Int, &c.generate_top_k, "Top-k for sampling"},
      {"generate-temperature", Kind::Double, &c.generate_temperature, "Sampling temperature"},
      {"save", Kind::String, &c.save,
       "Checkpoint root: iter_NNNNNNN directories and latest_checkpointed_iteration.txt (also saved at the end "
       "and on SIGTERM/SIGINT)"},
      {"save-interval", Kind::Int, &c.save_interval, "Steps between checkpoints (0: at the end only)"},
      {"load", Kind::String, &c.load,
       "Checkpoint root (its latest iteration) or iteration directory to resume; none there: start from scratch"},
      {"finetune", Kind::Bool, &c.finetune,
       "Load only the model weights from --load: iteration, optimizer, RNG and data position start afresh"},
      {"no-load-optim", Kind::Bool, &c.no_load_optim, "Do not load the optimizer state (Adam moments)"},
      {"no-load-rng", Kind::Bool, &c.no_load_rng, "Do not load the RNG state (router noise counters)"},
      {"use-checkpoint-args", Kind::Bool, &c.use_checkpoint_args,
       "Take the model flags (layers, sizes, experts, routing) from the checkpoint in --load"},
      {"exit-interval", Kind::Int, &c.exit_interval, "Save (with --save) and exit at iterations divisible by this"},
      {"load-hf", Kind::String, &c.load_hf,
       "HuggingFace model directory (Qwen3MoeForCausalLM, MixtralForCausalLM) to start from, unless --load "
       "holds a checkpoint"},
      {"moe-use-upcycling", Kind::Bool, &c.moe_use_upcycling,
       "Turn the dense checkpoint in --load into this MoE model, save it to --save and train on (resumes from "
       "--save once it holds a checkpoint)"},
      {"moe-upcycling-granularity", Kind::Int, &c.moe_upcycling_granularity,
       "Experts cut from one dense FFN: --ffn-hidden-size / --moe-ffn-hidden-size"},
      {"fault-kill-during-save", Kind::String, &c.fault_kill_during_save,
       "Testing crash safety: RANK:ITERATION makes that rank SIGKILL itself in the middle of that save"},
  };
}

int64_t to_int(const std::string& name, const std::string& v) {
  try {
    size_t pos = 0;
    const long long x = std::stoll(v, &pos);
    MOE_CHECK(pos == v.size(), "");
    return x;
  } catch (...) {
    MOE_CHECK(false, "--{} expects an integer, got '{}'", name, v);
  }
  return 0;
}

double to_double(const std::string& name, const std::string& v) {
  try {
    size_t pos = 0;
    const double x = std::stod(v, &pos);
    MOE_CHECK(pos == v.size(), "");
    return x;
  } catch (...) {
    MOE_CHECK(false, "--{} expects a number, got '{}'", name, v);
  }
  return 0;
}

void set_value(const Flag& f, const std::vector<std::string>& vals) {
  MOE_CHECK(f.kind == Kind::List || vals.size() == 1, "--{} takes one value, got {}", f.name, vals.size());
  switch (f.kind) {
    case Kind::Int: *static_cast<int64_t*>(f.field) = to_int(f.name, vals[0]); break;
    case Kind::Double: *static_cast<double*>(f.field) = to_double(f.name, vals[0]); break;
    case Kind::String: *static_cast<std::string*>(f.field) = vals[0]; break;
    case Kind::List: *static_cast<std::vector<std::string>*>(f.field) = vals; break;
    case Kind::Bool: {
      const std::string& v = vals[0];
      MOE_CHECK(v == "true" || v == "false" || v == "1" || v == "0", "--{} expects true or false, got '{}'", f.name,
                v);
      *static_cast<bool*>(f.field) = v == "true" || v == "1";
      break;
    }
  }
}

std::string get_value(const Flag& f) {
  switch (f.kind) {
    case Kind::Int: return std::to_string(*static_cast<int64_t*>(f.field));
    case Kind::Double: return fmt::format("{}", *static_cast<double*>(f.field));
    case Kind::Bool: return *static_cast<bool*>(f.field) ? "true" : "false";
    case Kind::String: return *static_cast<std::string*>(f.field);
    case Kind::List: {
      std::string s;
      for (const auto& v : *static_cast<std::vector<std::string>*>(f.field)) s += (s.empty() ? "" : " ") + v;
      return s;
    }
  }
  return "";
}

// Presets shape the architecture; every value can be overridden by --config or a flag.
void apply_preset(const std::string& name, TrainConfig& c) {
  const std::map<std::string, std::function<void(TrainConfig&)>> presets = {
      {"tiny-moe",
       [](TrainConfig& x) {  // the demo: 8 experts, top-2, a few million parameters
         x.num_layers = 4, x.hidden_size = 256, x.num_attention_heads = 4, x.group_query_attention = true;
         x.num_query_groups = 2, x.ffn_hidden_size = 512, x.swiglu = true, x.disable_bias_linear = true;
         x.num_experts = 8, x.moe_router_topk = 2, x.moe_ffn_hidden_size = 256;
         x.moe_router_load_balancing_type = {"aux_loss"}, x.moe_aux_loss_coeff = {"1e-2"}, x.moe_z_loss_coeff = 1e-3;
         x.seq_length = 128, x.micro_batch_size = 8, x.global_batch_size = 16;
         x.lr = 2e-3, x.min_lr = 1e-4, x.lr_warmup_iters = 20, x.lr_decay_style = "cosine", x.weight_decay = 0.1;
       }},
      {"mixtral",
       [](TrainConfig& x) {  // softmax top-2 over 8 experts, no shared expert, GQA, untied output
         x.num_layers = 4, x.hidden_size = 512, x.num_attention_heads = 8, x.group_query_attention = true;
         x.num_query_groups = 2, x.swiglu = true, x.disable_bias_linear = true, x.rotary_base = 1e6;
         x.untie_embeddings_and_output_weights = true, x.num_experts = 8, x.moe_router_topk = 2;
         x.moe_ffn_hidden_size = 1024, x.ffn_hidden_size = 1024, x.moe_aux_loss_coeff = {"1e-2"};
       }},
      {"qwen3-moe",
       [](TrainConfig& x) {  // qk-norm, fine-grained experts, top-8, fp32 router
         x.num_layers = 4, x.hidden_size = 512, x.num_attention_heads = 8, x.kv_channels = 64;
         x.group_query_attention = true, x.num_query_groups = 2, x.qk_layernorm = true, x.swiglu = true;
         x.disable_bias_linear = true, x.rotary_base = 1e6, x.untie_embeddings_and_output_weights = true;
         x.num_experts = 32, x.moe_router_topk = 8, x.moe_ffn_hidden_size = 128, x.ffn_hidden_size = 1024;
         x.moe_aux_loss_coeff = {"1e-3"};
       }},
      {"olmoe",
       [](TrainConfig& x) {  // qk-norm, 64 experts top-8 scaled down, aux and z losses
         x.num_layers = 4, x.hidden_size = 512, x.num_attention_heads = 8, x.qk_layernorm = true, x.swiglu = true;
         x.disable_bias_linear = true, x.untie_embeddings_and_output_weights = true, x.num_experts = 32;
         x.moe_router_topk = 4, x.moe_ffn_hidden_size = 128, x.ffn_hidden_size = 1024;
         x.moe_aux_loss_coeff = {"1e-2"}, x.moe_z_loss_coeff = 1e-3;
       }},
      {"deepseek-v3",
       [](TrainConfig& x) {  // sigmoid, groups, expert bias, scaling, shared expert, first layer dense
         x.num_layers = 4, x.hidden_size = 512, x.num_attention_heads = 8, x.swiglu = true;
         x.disable_bias_linear = true, x.untie_embeddings_and_output_weights = true, x.ffn_hidden_size = 1024;
         x.num_experts = 32, x.moe_router_topk = 4, x.moe_ffn_hidden_size = 128;
         x.moe_router_score_function = "sigmoid", x.moe_router_num_groups = 4, x.moe_router_group_topk = 2;
         x.moe_router_enable_expert_bias = true, x.moe_router_bias_update_rate = 1e-3;
         x.moe_router_topk_scaling_factor = 2.5, x.moe_shared_expert_intermediate_size = 128;
         x.moe_layer_freq = "([0]*1+[1]*3)", x.moe_router_load_balancing_type = {"seq_aux_loss"};
         x.moe_aux_loss_coeff = {"1e-4"};
       }},
  };
  auto it = presets.find(name);
  std::string names;
  for (auto& [k, v] : presets) names += (names.empty() ? "" : ", ") + k;
  MOE_CHECK(it != presets.end(), "--model {} is not a preset; choose one of {}", name, names);
  it->second(c);
}

}  // namespace

std::vector<std::string> preset_names() { return {"tiny-moe", "mixtral", "qwen3-moe", "olmoe", "deepseek-v3"}; }

TrainConfig parse_train_config(const std::vector<std::string>& args) {
  CLI::App app{"moecore train: train a (MoE) GPT with Megatron-LM's flags", "moecore train"};
  std::string config_file;
  app.add_option("--config", config_file, "YAML file whose keys are these flag names")->check(CLI::ExistingFile);
  TrainConfig scratch;
  std::vector<Flag> table = flag_table(scratch);
  std::map<std::string, std::vector<std::string>> cli_values;
  std::map<std::string, bool> cli_flags;
  std::map<std::string, CLI::Option*> opts;
  for (const auto& f : table) {
    if (f.kind == Kind::Bool)
      opts[f.name] = app.add_flag("--" + f.name, cli_flags[f.name], f.help);
    else if (f.kind == Kind::List)
      opts[f.name] = app.add_option("--" + f.name, cli_values[f.name], f.help)->expected(1, -1);
    else
      opts[f.name] = app.add_option("--" + f.name, cli_values[f.name], f.help)->expected(1);
  }
  // CLI11 expands a "[a,b,c]" argument into three values; --moe-layer-freq takes a Python list expression as one
  // string, so its value gets a leading space (whitespace is insignificant to the pattern parser).
  std::vector<std::string> fixed = args;
  for (size_t i = 0; i < fixed.size(); i++) {
    if (fixed[i] == "--moe-layer-freq" && i + 1 < fixed.size()) fixed[i + 1] = " " + fixed[i + 1];
    if (fixed[i].rfind("--moe-layer-freq=", 0) == 0) fixed[i] = "--moe-layer-freq= " + fixed[i].substr(17);
  }
  std::vector<std::string> rev(fixed.rbegin(), fixed.rend());
  try {
    app.parse(rev);
  } catch (const CLI::CallForHelp&) {
    throw HelpRequested{app.help()};
  } catch (const CLI::ParseError& e) {
    MOE_CHECK(false, "moecore train: {} (see moecore train --help)", e.what());
  }
  // Preset (command line first, then the YAML file), then YAML values, then flags.
  TrainConfig c;
  std::vector<Flag> live = flag_table(c);
  auto find = [&](const std::string& key) -> const Flag* {
    std::string k = key;
    for (char& ch : k)
      if (ch == '_') ch = '-';
    for (const auto& f : live)
      if (f.name == k) return &f;
    return nullptr;
  };
  YAML::Node yaml;
  if (!config_file.empty()) {
    try {
      yaml = YAML::LoadFile(config_file);
    } catch (const YAML::Exception& e) {
      MOE_CHECK(false, "--config {}: not valid YAML: {}", config_file, e.what());
    }
    MOE_CHECK(yaml.IsMap() || yaml.IsNull(), "--config {}: expected a mapping of flag names to values", config_file);
  }
  std::string preset = opts["model"]->count() ? cli_values["model"][0] : "";
  if (preset.empty() && yaml && yaml["model"]) preset = yaml["model"].as<std::string>();
  if (!preset.empty()) {
    apply_preset(preset, c);
    c.model = preset;
  }
  // --load-hf: the HF config.json's architecture (and its tokenizer), under YAML values and flags.
  std::string load_hf = opts["load-hf"]->count() ? cli_values["load-hf"][0] : "";
  for (const char* k : {"load-hf", "load_hf"})
    if (load_hf.empty() && yaml && yaml.IsMap() && yaml[k]) load_hf = yaml[k].as<std::string>();
  if (!load_hf.empty()) {
    const std::string cfg = load_hf + "/config.json";
    MOE_CHECK(std::filesystem::exists(cfg), "--load-hf {}: no config.json there (a HuggingFace model directory?)",
              load_hf);
    std::ifstream in(cfg);
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(in);
    } catch (const nlohmann::json::exception& e) {
      MOE_CHECK(false, "{} is not valid JSON ({})", cfg, e.what());
    }
    apply_config_json(c, ckpt::hf_train_flags(j, cfg), cfg);
    if (std::filesystem::exists(load_hf + "/tokenizer.json")) {
      c.tokenizer_type = "HuggingFaceTokenizer";
      c.tokenizer_model = load_hf;
    }
  }
  if (yaml && yaml.IsMap()) {
    for (const auto& kv : yaml) {
      const std::string key = kv.first.as<std::string>();
      const Flag* f = find(key);
      MOE_CHECK(f != nullptr, "--config {}: unknown key '{}' (keys are moecore train's flag names)", config_file, key);
      if (f->name == "model") continue;
      std::vector<std::string> vals;
      if (kv.second.IsSequence()) {
        for (const auto& v : kv.second) vals.push_back(v.as<std::string>());
      } else {
        MOE_CHECK(kv.second.IsScalar(), "--config {}: '{}' must be a scalar or a list", config_file, key);
        vals.push_back(kv.second.as<std::string>());
      }
      set_value(*f, vals);
    }
  }
  for (const auto& f : live) {
    if (!opts[f.name]->count() || f.name == "model") continue;
    if (f.kind == Kind::Bool)
      *static_cast<bool*>(f.field) = cli_flags[f.name];
    else
      set_value(f, cli_values[f.name]);
  }
  if (c.use_checkpoint_args) {  // Megatron's --use-checkpoint-args: the checkpoint's model flags win
    MOE_CHECK(!c.load.empty(), "--use-checkpoint-args needs --load");
    const auto found = ckpt::find_checkpoint(c.load);
    MOE_CHECK(found, "--use-checkpoint-args: --load {} holds no checkpoint", c.load);
    nlohmann::json model = nlohmann::json::object();
    const auto& saved = found->state.at("config");
    for (const auto& k : model_flag_names())
      if (saved.contains(k)) model[k] = saved[k];
    for (const char* k : {"group-query-attention", "max-position-embeddings"})
      if (saved.contains(k)) model[k] = saved[k];
    apply_config_json(c, model, found->dir + "/" + ckpt::kStateFile);
  }
  validate(c);
  return c;
}

const std::vector<std::string>& model_flag_names() {
  static const std::vector<std::string> names = {
      "num-layers", "hidden-size", "ffn-hidden-size", "num-attention-heads", "num-query-groups", "kv-channels",
      "qk-layernorm", "rotary-base", "rotary-percent", "norm-epsilon", "untie-embeddings-and-output-weights",
      "swiglu", "squared-relu", "disable-bias-linear", "num-experts", "moe-ffn-hidden-size", "moe-router-topk",
      "moe-router-score-function", "moe-router-pre-softmax", "moe-router-topk-scaling-factor",
      "moe-router-num-groups", "moe-router-group-topk", "moe-router-enable-expert-bias",
      "moe-shared-expert-intermediate-size", "moe-shared-expert-gate", "moe-layer-freq"};
  return names;
}

void validate(TrainConfig& c) {
  auto pos = [](int64_t v, const char* n) { MOE_CHECK(v > 0, "--{} must be positive, got {}", n, v); };
  pos(c.num_layers, "num-layers");
  pos(c.hidden_size, "hidden-size");
  pos(c.num_attention_heads, "num-attention-heads");
  pos(c.seq_length, "seq-length");
  pos(c.micro_batch_size, "micro-batch-size");
  MOE_CHECK(c.position_embedding_type == "rope",
            "--position-embedding-type {} is rejected: moecore has rope only", c.position_embedding_type);
  MOE_CHECK(c.normalization == "RMSNorm", "--normalization {} is rejected: moecore has RMSNorm only", c.normalization);
  MOE_CHECK(!(c.swiglu && c.squared_relu), "--swiglu and --squared-relu are exclusive");
  if (c.kv_channels == 0) {
    MOE_CHECK(c.hidden_size % c.num_attention_heads == 0,
              "--hidden-size {} is not divisible by --num-attention-heads {}; set --kv-channels", c.hidden_size,
              c.num_attention_heads);
    c.kv_channels = c.hidden_size / c.num_attention_heads;
  }
  if (!c.group_query_attention) c.num_query_groups = c.num_attention_heads;
  MOE_CHECK(c.num_query_groups > 0 && c.num_attention_heads % c.num_query_groups == 0,
            "--num-attention-heads {} must be a multiple of --num-query-groups {}", c.num_attention_heads,
            c.num_query_groups);
  if (c.ffn_hidden_size == 0)
    c.ffn_hidden_size = c.swiglu ? (4 * c.hidden_size * 2 / 3) / 64 * 64 : 4 * c.hidden_size;
  pos(c.ffn_hidden_size, "ffn-hidden-size");
  if (c.max_position_embeddings == 0) c.max_position_embeddings = c.seq_length;
  MOE_CHECK(c.max_position_embeddings >= c.seq_length, "--max-position-embeddings {} is below --seq-length {}",
            c.max_position_embeddings, c.seq_length);
  MOE_CHECK(c.rotary_percent > 0 && c.rotary_percent <= 1, "--rotary-percent must be in (0, 1]");
  if (c.expert_tensor_parallel_size == 0) c.expert_tensor_parallel_size = c.tensor_model_parallel_size;
  for (auto [v, n] : {std::pair{c.pipeline_model_parallel_size, "pipeline-model-parallel-size"},
                      std::pair{c.context_parallel_size, "context-parallel-size"}})
    MOE_CHECK(v == 1,
              "--{} {}: pipeline and context parallelism are not available yet; run with 1 (tensor, sequence, "
              "data, expert and expert-tensor parallelism over mpirun ranks are)",
              n, v);
  const int64_t tp = c.tensor_model_parallel_size, etp = c.expert_tensor_parallel_size;
  MOE_CHECK(tp >= 1 && etp >= 1, "--tensor-model-parallel-size and --expert-tensor-parallel-size must be >= 1");
  if (tp > 1) {
    MOE_CHECK(c.sequence_parallel,
              "--tensor-model-parallel-size {} needs --sequence-parallel: moecore runs tensor parallelism with "
              "sequence parallelism only (Megatron requires it for MoE; add the flag)",
              tp);
    MOE_CHECK(c.disable_bias_linear,
              "--tensor-model-parallel-size {} with linear biases is not available; pass --disable-bias-linear", tp);
    MOE_CHECK(c.num_attention_heads % tp == 0 && c.num_query_groups % tp == 0,
              "--num-attention-heads {} and --num-query-groups {} must be divisible by --tensor-model-parallel-size {}",
              c.num_attention_heads, c.num_query_groups, tp);
    MOE_CHECK(c.seq_length % tp == 0, "--seq-length {} must be divisible by --tensor-model-parallel-size {} "
              "(sequence parallelism splits it)", c.seq_length, tp);
    MOE_CHECK(c.ffn_hidden_size % tp == 0, "--ffn-hidden-size {} must be divisible by --tensor-model-parallel-size {}",
              c.ffn_hidden_size, tp);
    MOE_CHECK(c.moe_shared_expert_intermediate_size % tp == 0,
              "--moe-shared-expert-intermediate-size {} must be divisible by --tensor-model-parallel-size {}",
              c.moe_shared_expert_intermediate_size, tp);
  }
  MOE_CHECK(c.save_interval >= 0 && c.exit_interval >= 0, "--save-interval and --exit-interval must be >= 0");
  MOE_CHECK(c.save_interval == 0 || !c.save.empty(), "--save-interval {} without --save: add --save DIR",
            c.save_interval);
  for (auto [on, name] : {std::pair{c.finetune, "finetune"}, {c.no_load_optim, "no-load-optim"},
                          {c.no_load_rng, "no-load-rng"}, {c.moe_use_upcycling, "moe-use-upcycling"}})
    MOE_CHECK(!on || !c.load.empty(), "--{} needs --load (the checkpoint it applies to)", name);
  MOE_CHECK(c.moe_upcycling_granularity >= 1, "--moe-upcycling-granularity must be >= 1");
  MOE_CHECK(c.moe_upcycling_granularity == 1 || c.moe_use_upcycling,
            "--moe-upcycling-granularity {} without --moe-use-upcycling", c.moe_upcycling_granularity);
  if (c.moe_use_upcycling) {
    MOE_CHECK(c.num_experts > 0, "--moe-use-upcycling needs --num-experts (the MoE model to make)");
    MOE_CHECK(!c.save.empty(), "--moe-use-upcycling needs --save (where the upcycled checkpoint goes)");
    MOE_CHECK(c.load_hf.empty(), "--moe-use-upcycling upcycles a native dense checkpoint (--load), not --load-hf");
  }
  if (!c.fault_kill_during_save.empty()) {
    const auto colon = c.fault_kill_during_save.find(':');
    MOE_CHECK(colon != std::string::npos, "--fault-kill-during-save expects RANK:ITERATION, got '{}'",
              c.fault_kill_during_save);
    to_int("fault-kill-during-save", c.fault_kill_during_save.substr(0, colon));
    to_int("fault-kill-during-save", c.fault_kill_during_save.substr(colon + 1));
  }
  MOE_CHECK(c.optimizer == "adam", "--optimizer {} is rejected: moecore has adam (AdamW) only", c.optimizer);
  if (c.global_batch_size == 0) c.global_batch_size = c.micro_batch_size;
  MOE_CHECK(c.global_batch_size % c.micro_batch_size == 0,
            "--global-batch-size {} must be a multiple of --micro-batch-size {} x data-parallel size 1",
            c.global_batch_size, c.micro_batch_size);
  MOE_CHECK(c.skip_train || c.train_iters > 0, "--train-iters must be positive (or pass --skip-train)");
  if (c.lr_decay_iters == 0) c.lr_decay_iters = c.train_iters;
  pos(c.log_interval, "log-interval");
  pos(c.eval_interval, "eval-interval");
  MOE_CHECK(c.eval_iters >= 0, "--eval-iters must be >= 0");
  MOE_CHECK(c.weight_decay >= 0 && c.clip_grad >= 0, "--weight-decay and --clip-grad must be >= 0");
  MOE_CHECK(c.generate_temperature > 0 && c.generate_top_k >= 0 && c.generate_tokens >= 0,
            "--generate-temperature must be positive and --generate-top-k, --generate-tokens >= 0");
  MOE_CHECK(c.mock_data != !c.data_path.empty(), "give exactly one of --data-path and --mock-data");
  MOE_CHECK(c.tokenizer_type.empty() || c.tokenizer_type == "HuggingFaceTokenizer" ||
                c.tokenizer_type == "NullTokenizer",
            "--tokenizer-type {} is not supported; use HuggingFaceTokenizer or NullTokenizer", c.tokenizer_type);
  if (c.tokenizer_type == "HuggingFaceTokenizer")
    MOE_CHECK(!c.tokenizer_model.empty(), "--tokenizer-type HuggingFaceTokenizer needs --tokenizer-model");
  if (c.tokenizer_type == "NullTokenizer" || c.tokenizer_type.empty())
    MOE_CHECK(c.vocab_size > 0, "--vocab-size is required with {} (or use --tokenizer-type HuggingFaceTokenizer)",
              c.tokenizer_type.empty() ? "no --tokenizer-type" : "NullTokenizer");
  MOE_CHECK(c.tokenizer_type != "" || c.mock_data, "--data-path needs a --tokenizer-type");
  validate(lr_schedule(c));
  if (c.num_experts > 0) {
    MOE_CHECK(c.disable_bias_linear,
              "--num-experts with linear biases: moecore's experts have no bias; pass --disable-bias-linear");
    if (c.moe_ffn_hidden_size == 0) c.moe_ffn_hidden_size = c.ffn_hidden_size;
    MOE_CHECK(c.moe_grouped_gemm, "moe-grouped-gemm: false is rejected: moecore always runs experts as grouped GEMMs");
    MOE_CHECK(c.moe_token_dispatcher_type == "alltoall" || c.moe_token_dispatcher_type == "allgather",
              "--moe-token-dispatcher-type {} is rejected; use alltoall or allgather",
              c.moe_token_dispatcher_type);
    MOE_CHECK(c.expert_model_parallel_size >= 1 && c.num_experts % c.expert_model_parallel_size == 0,
              "--num-experts {} is not divisible by --expert-model-parallel-size {}", c.num_experts,
              c.expert_model_parallel_size);
    MOE_CHECK(c.moe_ffn_hidden_size % etp == 0,
              "--moe-ffn-hidden-size {} must be divisible by --expert-tensor-parallel-size {}", c.moe_ffn_hidden_size,
              etp);
    moe::validate(moe_layer_config(c));
    moe::parse_moe_layer_freq(c.moe_layer_freq, c.num_layers);
    if (c.moe_use_upcycling) {  // reference §1.14: g = F_dense / F_moe, experts E = r·g
      const int64_t g = c.moe_upcycling_granularity;
      MOE_CHECK(c.moe_ffn_hidden_size * g == c.ffn_hidden_size,
                "--moe-upcycling-granularity {} cuts the dense FFN of --ffn-hidden-size {} into experts of {}: set "
                "--moe-ffn-hidden-size {}",
                g, c.ffn_hidden_size, c.ffn_hidden_size / g, c.ffn_hidden_size / g);
      MOE_CHECK(c.ffn_hidden_size % g == 0 && c.num_experts % g == 0,
                "--moe-upcycling-granularity {} must divide --ffn-hidden-size {} and --num-experts {}", g,
                c.ffn_hidden_size, c.num_experts);
      MOE_CHECK(c.moe_shared_expert_intermediate_size == 0,
                "--moe-use-upcycling with shared experts is not supported: the dense FFN becomes the routed experts");
    }
  } else {
    MOE_CHECK(c.expert_model_parallel_size == 1, "--expert-model-parallel-size {} needs --num-experts",
              c.expert_model_parallel_size);
    MOE_CHECK(c.moe_shared_expert_intermediate_size == 0 && c.moe_ffn_hidden_size == 0,
              "--moe-* sizes are set but --num-experts is 0");
  }
}

std::vector<std::string> override_flags(std::vector<std::string> base, const std::vector<std::string>& extra) {
  for (const auto& f : extra) {
    if (f.rfind("--", 0) != 0) continue;
    const auto it = std::find(base.begin(), base.end(), f);
    if (it == base.end()) continue;
    auto end = it + 1;
    while (end != base.end() && end->rfind("--", 0) != 0) ++end;
    base.erase(it, end);
  }
  base.insert(base.end(), extra.begin(), extra.end());
  return base;
}

nlohmann::json config_json(const TrainConfig& c0) {
  TrainConfig c = c0;
  nlohmann::json j = nlohmann::json::object();
  for (const auto& f : flag_table(c)) {
    switch (f.kind) {
      case Kind::Int: j[f.name] = *static_cast<int64_t*>(f.field); break;
      case Kind::Double: j[f.name] = *static_cast<double*>(f.field); break;
      case Kind::Bool: j[f.name] = *static_cast<bool*>(f.field); break;
      case Kind::String: j[f.name] = *static_cast<std::string*>(f.field); break;
      case Kind::List: j[f.name] = *static_cast<std::vector<std::string>*>(f.field); break;
    }
  }
  return j;
}

void apply_config_json(TrainConfig& c, const nlohmann::json& j, const std::string& where) {
  MOE_CHECK(j.is_object(), "{}: the configuration is not an object", where);
  for (const auto& f : flag_table(c)) {
    if (!j.contains(f.name)) continue;
    const auto& v = j[f.name];
    try {
      switch (f.kind) {
        case Kind::Int: *static_cast<int64_t*>(f.field) = v.get<int64_t>(); break;
        case Kind::Double: *static_cast<double*>(f.field) = v.get<double>(); break;
        case Kind::Bool: *static_cast<bool*>(f.field) = v.get<bool>(); break;
        case Kind::String: *static_cast<std::string*>(f.field) = v.get<std::string>(); break;
        case Kind::List: *static_cast<std::vector<std::string>*>(f.field) = v.get<std::vector<std::string>>(); break;
      }
    } catch (const nlohmann::json::exception&) {
      MOE_CHECK(false, "{}: '{}' has the wrong type ({})", where, f.name, v.dump());
    }
  }
}

std::string describe(const TrainConfig& c0) {
  TrainConfig c = c0;
  std::string s;
  for (const auto& f : flag_table(c)) s += fmt::format("  {:.<42} {}\n", f.name + " ", get_value(f));
  return s;
}

int64_t padded_vocab_size(const TrainConfig& c, int64_t vocab) {
  const int64_t m = std::max<int64_t>(1, c.make_vocab_size_divisible_by * c.tensor_model_parallel_size);
  return (vocab + m - 1) / m * m;
}

nn::GPTConfig gpt_config(const TrainConfig& c, int64_t padded_vocab) {
  nn::GPTConfig g;
  g.num_layers = c.num_layers;
  g.hidden_size = c.hidden_size;
  g.ffn_hidden_size = c.ffn_hidden_size;
  g.num_attention_heads = c.num_attention_heads;
  g.num_query_groups = c.num_query_groups;
  g.kv_channels = c.kv_channels;
  g.vocab_size = padded_vocab;
  g.max_seq_len = c.max_position_embeddings;
  g.rotary_base = c.rotary_base;
  g.rotary_percent = c.rotary_percent;
  g.qk_layernorm = c.qk_layernorm;
  g.untie_embeddings_and_output_weights = c.untie_embeddings_and_output_weights;
  g.norm_eps = c.norm_epsilon;
  g.init_method_std = c.init_method_std;
  g.activation = c.swiglu ? kernels::Activation::SwiGLU
                          : (c.squared_relu ? kernels::Activation::SquaredReLU : kernels::Activation::GeLU);
  g.add_bias_linear = !c.disable_bias_linear;
  g.bf16 = c.bf16;
  return g;
}

moe::MoELayerConfig moe_layer_config(const TrainConfig& c) {
  moe::MoELayerConfig m;
  moe::RouterConfig& r = m.router;
  r.hidden = c.hidden_size;
  r.num_experts = c.num_experts;
  r.topk = c.moe_router_topk;
  r.score_function = moe::parse_score_function(c.moe_router_score_function);
  r.pre_softmax = c.moe_router_pre_softmax;
  r.topk_scaling_factor = c.moe_router_topk_scaling_factor;
  r.num_groups = c.moe_router_num_groups;
  r.group_topk = c.moe_router_group_topk;
  r.enable_expert_bias = c.moe_router_enable_expert_bias;
  r.bias_update_rate = c.moe_router_bias_update_rate;
  r.load_balancing.clear();
  for (const auto& t : c.moe_router_load_balancing_type) r.load_balancing.push_back(moe::parse_load_balancing_type(t));
  r.aux_loss_coeff.clear();
  for (const auto& v : c.moe_aux_loss_coeff) r.aux_loss_coeff.push_back(to_double("moe-aux-loss-coeff", v));
  r.z_loss_coeff = c.moe_z_loss_coeff;
  r.input_jitter_eps = c.moe_input_jitter_eps;
  r.force_load_balancing = c.moe_router_force_load_balancing;
  MOE_CHECK(c.moe_router_dtype == "fp32" || c.moe_router_dtype == "fp64", "--moe-router-dtype {}: use fp32 or fp64",
            c.moe_router_dtype);
  r.router_dtype = c.moe_router_dtype == "fp64" ? DType::F64 : DType::F32;
  r.capacity_factor = c.moe_expert_capacity_factor;
  r.drop_policy = moe::parse_drop_policy(c.moe_token_drop_policy);
  r.pad_to_capacity = c.moe_pad_expert_input_to_capacity;
  r.init_std = c.init_method_std;
  r.seed = static_cast<uint64_t>(c.seed);
  m.ffn_hidden = c.moe_ffn_hidden_size > 0 ? c.moe_ffn_hidden_size : c.ffn_hidden_size;
  m.shared_ffn_hidden = c.moe_shared_expert_intermediate_size;
  m.shared_expert_gate = c.moe_shared_expert_gate;
  m.activation = c.swiglu ? kernels::Activation::SwiGLU
                          : (c.squared_relu ? kernels::Activation::SquaredReLU : kernels::Activation::GeLU);
  m.init_std = c.init_method_std;
  m.output_init_std = c.init_method_std / std::sqrt(2.0 * static_cast<double>(c.num_layers));
  m.bf16 = c.bf16;
  m.allgather_dispatcher = c.moe_token_dispatcher_type == "allgather";
  return m;
}

optim::LRSchedule lr_schedule(const TrainConfig& c) {
  optim::LRSchedule s;
  s.max_lr = c.lr;
  s.min_lr = c.min_lr;
  s.warmup_iters = c.lr_warmup_iters;
  s.decay_iters = c.lr_decay_iters > 0 ? c.lr_decay_iters : c.train_iters;
  s.style = c.lr_decay_style;
  s.wsd_style = c.lr_wsd_decay_style;
  s.wsd_decay_iters = c.lr_wsd_decay_iters;
  return s;
}

}  // namespace moecore::train
