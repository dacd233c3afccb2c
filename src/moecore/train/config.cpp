// Training configuration (see config.h): the flag table, and what derives from it directly: values from strings
// and back, the JSON form checkpoints store, the printed configuration, role lists, and the module configs.
// Not here: the CLI11/YAML parser (flag_parser.cpp), the two resolve passes (config_resolve.cpp), presets.
#include "moecore/train/config.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <optional>

#include "moecore/core/error.h"
#include "moecore/train/presets.h"

namespace moecore::train {

namespace {

std::vector<FlagSpec> build_flag_table() {
  using C = TrainConfig;
  std::vector<FlagSpec> t;
  auto section = [&](FlagGroup g, std::vector<FlagSpec> flags) {
    for (auto& f : flags) {
      f.group = g;
      t.push_back(std::move(f));
    }
  };
  std::string presets;
  for (const auto& p : preset_names()) presets += (presets.empty() ? "" : ", ") + p;
  section(
      FlagGroup::Model,
      {{"model", &C::model, "Preset: " + presets + " (flags override)"},
       {"num-layers", &C::num_layers, "Transformer layers", kModel, above_to(0, 2147483647)},
       {"hidden-size", &C::hidden_size, "Hidden size H", kModel, positive()},
       {"ffn-hidden-size", &C::ffn_hidden_size, "Dense FFN size (default 4H; 8H/3 rounded to 64 with --swiglu)",
        kModel | kDerived, positive()},
       {"num-attention-heads", &C::num_attention_heads, "Query heads", kModel, positive()},
       {"group-query-attention", &C::group_query_attention, "Use --num-query-groups key/value heads", kCheckpointArg},
       {"num-query-groups", &C::num_query_groups, "Key/value heads with --group-query-attention", kModel | kDerived,
        positive()},
       {"kv-channels", &C::kv_channels, "Head dimension (default H / heads)", kModel | kDerived, positive()},
       {"qk-layernorm", &C::qk_layernorm, "RMSNorm on each query and key head (Qwen3, OLMoE)", kModel},
       {"seq-length", &C::seq_length, "Sequence length", kNoRole, positive()},
       {"max-position-embeddings", &C::max_position_embeddings, "Longest position (default --seq-length)",
        kCheckpointArg | kDerived, positive()},
       {"rotary-base", &C::rotary_base, "RoPE base", kModel, positive()},
       {"rotary-percent", &C::rotary_percent, "Fraction of each head rotated", kModel, above_to(0, 1)},
       {"position-embedding-type", &C::position_embedding_type, "rope (the only one implemented)", kNoRole,
        one_of({"rope"})},
       {"normalization", &C::normalization, "RMSNorm (the only one implemented)", kNoRole, one_of({"RMSNorm"})},
       {"norm-epsilon", &C::norm_epsilon, "RMSNorm epsilon", kModel, at_least(0)},
       {"untie-embeddings-and-output-weights", &C::untie_embeddings_and_output_weights, "Separate output layer",
        kModel},
       {"swiglu", &C::swiglu, "SwiGLU FFNs (default GeLU)", kModel},
       {"squared-relu", &C::squared_relu, "Squared-ReLU FFNs", kModel},
       {"disable-bias-linear", &C::disable_bias_linear, "No biases in linear layers (required for MoE)", kModel},
       {"init-method-std", &C::init_method_std, "Std of the normal weight init", kNoRole, at_least(0)},
       {"make-vocab-size-divisible-by", &C::make_vocab_size_divisible_by, "Pad the vocabulary to a multiple", kNoRole,
        positive()}});
  section(FlagGroup::MoE,
          {{"num-experts", &C::num_experts, "Routed experts per MoE layer (0: dense)", kModel, at_least(0)},
           {"moe-ffn-hidden-size", &C::moe_ffn_hidden_size, "Expert FFN size (default --ffn-hidden-size)",
            kModel | kDerived, at_least(0)},
           {"moe-router-topk", &C::moe_router_topk, "Experts per token", kModel, positive()},
           {"moe-router-score-function", &C::moe_router_score_function, "softmax or sigmoid", kModel,
            one_of({"softmax", "sigmoid"})},
           {"moe-router-pre-softmax", &C::moe_router_pre_softmax, "Softmax over all experts before top-k", kModel},
           {"moe-router-topk-scaling-factor", &C::moe_router_topk_scaling_factor, "Scale routing probs", kModel,
            at_least(0)},
           {"moe-router-num-groups", &C::moe_router_num_groups, "Expert groups for group-limited routing", kModel,
            at_least(0)},
           {"moe-router-group-topk", &C::moe_router_group_topk, "Groups each token may use", kModel, at_least(0)},
           {"moe-router-enable-expert-bias", &C::moe_router_enable_expert_bias, "Aux-loss-free balancing", kModel},
           {"moe-router-bias-update-rate", &C::moe_router_bias_update_rate, "Expert-bias step per batch", kNoRole,
            at_least(0)},
           {"moe-router-load-balancing-type", &C::moe_router_load_balancing_type,
            "aux_loss, seq_aux_loss, global_aux_loss, none (a list)", kNoRole,
            one_of({"aux_loss", "seq_aux_loss", "global_aux_loss", "none"})},
           {"moe-aux-loss-coeff", &C::moe_aux_loss_coeff, "One coefficient per load-balancing type"},
           {"moe-z-loss-coeff", &C::moe_z_loss_coeff, "Router z-loss coefficient", kNoRole, at_least(0)},
           {"moe-input-jitter-eps", &C::moe_input_jitter_eps, "Multiplicative router input jitter", kNoRole,
            between(0, 1, true)},
           {"moe-router-force-load-balancing", &C::moe_router_force_load_balancing, "Route on noise (bench)"},
           {"moe-router-dtype", &C::moe_router_dtype, "fp32 or fp64", kNoRole, one_of({"fp32", "fp64"})},
           {"moe-expert-capacity-factor", &C::moe_expert_capacity_factor, "Capacity factor (<0: dropless)"},
           {"moe-token-drop-policy", &C::moe_token_drop_policy, "probs or position", kNoRole,
            one_of({"probs", "position"})},
           {"moe-pad-expert-input-to-capacity", &C::moe_pad_expert_input_to_capacity, "Pad to capacity"},
           {"moe-shared-expert-intermediate-size", &C::moe_shared_expert_intermediate_size, "Shared expert size",
            kModel, at_least(0)},
           {"moe-shared-expert-gate", &C::moe_shared_expert_gate, "Sigmoid gate on the shared expert", kModel},
           {"moe-layer-freq", &C::moe_layer_freq, "N or a list such as ([0]*1+[1]*3)", kModel | kListExpression},
           {"moe-grouped-gemm", &C::moe_grouped_gemm, "Grouped GEMM experts (always on in moecore)"},
           {"moe-token-dispatcher-type", &C::moe_token_dispatcher_type,
            "alltoall or allgather (one rank: local dispatch either way)", kNoRole, one_of({"alltoall", "allgather"})},
           {"moe-per-layer-logging", &C::moe_per_layer_logging, "Log each MoE layer's losses and load"}});
  section(
      FlagGroup::Training,
      {{"micro-batch-size", &C::micro_batch_size, "Sequences per micro-batch", kNoRole, positive()},
       {"global-batch-size", &C::global_batch_size, "Sequences per step (default micro x DP)", kDerived, positive()},
       {"train-iters", &C::train_iters, "Optimizer steps", kNoRole, at_least(0)},
       {"lr", &C::lr, "Peak learning rate", kSchedule, at_least(0)},
       {"min-lr", &C::min_lr, "Final learning rate", kSchedule, at_least(0)},
       {"lr-decay-style", &C::lr_decay_style, "constant, linear, cosine or WSD", kSchedule,
        one_of({"constant", "linear", "cosine", "WSD"})},
       {"lr-wsd-decay-style", &C::lr_wsd_decay_style, "WSD anneal: linear, cosine, exponential, minus_sqrt", kSchedule,
        one_of({"linear", "cosine", "exponential", "minus_sqrt"})},
       {"lr-warmup-iters", &C::lr_warmup_iters, "Linear warmup steps", kSchedule, at_least(0)},
       {"lr-decay-iters", &C::lr_decay_iters, "Decay steps (default --train-iters)", kSchedule | kDerived, at_least(0)},
       {"lr-wsd-decay-iters", &C::lr_wsd_decay_iters, "WSD anneal steps", kSchedule, at_least(0)},
       {"weight-decay", &C::weight_decay, "AdamW weight decay (not on norms and biases)", kNoRole, at_least(0)},
       {"clip-grad", &C::clip_grad, "Global gradient-norm clip (0: off)", kNoRole, at_least(0)},
       {"adam-beta1", &C::adam_beta1, "Adam beta1", kNoRole, between(0, 1, true)},
       {"adam-beta2", &C::adam_beta2, "Adam beta2", kNoRole, between(0, 1, true)},
       {"adam-eps", &C::adam_eps, "Adam epsilon", kNoRole, at_least(0)},
       {"optimizer", &C::optimizer, "adam (AdamW)", kNoRole, one_of({"adam"})},
       {"seed", &C::seed, "Random seed"},
       {"bf16", &C::bf16, "bf16 GEMMs with fp32 master weights and accumulation"},
       {"testing-memory-limit", &C::testing_memory_limit,
        "Testing: bytes this rank may use, instead of the cgroup or MemAvailable limit (0: detect)", kNoRole,
        at_least(0)}});
  section(FlagGroup::Parallel,
          {{"tensor-model-parallel-size", &C::tensor_model_parallel_size, "TP", kNoRole, positive()},
           {"pipeline-model-parallel-size", &C::pipeline_model_parallel_size, "PP", kNoRole, positive()},
           {"context-parallel-size", &C::context_parallel_size, "CP", kNoRole, positive()},
           {"expert-model-parallel-size", &C::expert_model_parallel_size, "EP", kNoRole, positive()},
           {"expert-tensor-parallel-size", &C::expert_tensor_parallel_size, "ETP (default TP)", kDerived, positive()},
           {"sequence-parallel", &C::sequence_parallel, "Sequence parallelism (with TP)"},
           {"use-distributed-optimizer", &C::use_distributed_optimizer,
            "Shard fp32 master weights and Adam moments over DPxCP (dense) and EDP (experts)"}});
  section(FlagGroup::Data,
          {{"data-path", &C::data_path, "Dataset prefix, or weight/prefix pairs"},
           {"split", &C::split, "train,valid,test proportions"},
           {"mock-data", &C::mock_data, "Synthetic tokens instead of --data-path"},
           {"tokenizer-type", &C::tokenizer_type, "HuggingFaceTokenizer or NullTokenizer", kNoRole,
            one_of({"", "HuggingFaceTokenizer", "NullTokenizer"})},
           {"tokenizer-model", &C::tokenizer_model, "tokenizer.json or its directory"},
           {"vocab-size", &C::vocab_size, "Vocabulary with NullTokenizer or --mock-data", kNoRole, at_least(0)}});
  section(FlagGroup::Logging,
          {{"eval-interval", &C::eval_interval, "Steps between validations", kNoRole, positive()},
           {"eval-iters", &C::eval_iters, "Global batches per validation", kNoRole, at_least(0)},
           {"log-interval", &C::log_interval, "Steps between log lines", kNoRole, positive()},
           {"skip-train", &C::skip_train, "Only evaluate"},
           {"metrics-file", &C::metrics_file, "JSON lines of logged metrics"},
           {"generate-prompts", &C::generate_prompts, "Prompts to sample from after training"},
           {"generate-tokens", &C::generate_tokens, "Tokens to sample per prompt", kNoRole, at_least(0)},
           {"generate-top-k", &C::generate_top_k, "Top-k for sampling", kNoRole, at_least(0)},
           {"generate-temperature", &C::generate_temperature, "Sampling temperature", kNoRole, positive()}});
  section(
      FlagGroup::Checkpoint,
      {{"save", &C::save,
        "Checkpoint root: iter_NNNNNNN directories and latest_checkpointed_iteration.txt (also saved at the end and "
        "on SIGTERM/SIGINT)"},
       {"save-interval", &C::save_interval, "Steps between checkpoints (0: at the end only)", kNoRole, at_least(0)},
       {"load", &C::load,
        "Checkpoint root (its latest iteration) or iteration directory to resume; none there: start from scratch"},
       {"ckpt-step", &C::ckpt_step,
        "Load iteration N of --load (its iter_NNNNNNN directory) instead of the one its marker names (-1: the "
        "marker's)",
        kNoRole, at_least(-1)},
       {"finetune", &C::finetune,
        "Load only the model weights from --load: iteration, optimizer, RNG and data position start afresh"},
       {"no-load-optim", &C::no_load_optim, "Do not load the optimizer state (Adam moments)"},
       {"no-load-rng", &C::no_load_rng, "Do not load the RNG state (router noise counters)"},
       {"use-checkpoint-args", &C::use_checkpoint_args,
        "Take the model flags (layers, sizes, experts, routing) from the checkpoint in --load"},
       {"exit-interval", &C::exit_interval, "Save (with --save) and exit at iterations divisible by this", kNoRole,
        at_least(0)},
       {"exit-signal-handler", &C::exit_signal_handler,
        "Stop at the next step boundary on --exit-signal, saving with --save (moecore also does so on SIGTERM, "
        "SIGINT, SIGUSR1 and SIGUSR2 whenever --save is given)"},
       {"exit-signal", &C::exit_signal,
        "The signal --exit-signal-handler waits for: SIGTERM, SIGINT, SIGUSR1, "
        "SIGUSR2 or SIGHUP"},
       {"load-hf", &C::load_hf,
        "HuggingFace model directory (Qwen3MoeForCausalLM, MixtralForCausalLM) to start from, unless --load holds a "
        "checkpoint"},
       {"moe-use-upcycling", &C::moe_use_upcycling,
        "Turn the dense checkpoint in --load into this MoE model, save it to --save and train on (resumes from "
        "--save once it holds a checkpoint)"},
       {"moe-upcycling-granularity", &C::moe_upcycling_granularity,
        "Experts cut from one dense FFN: --ffn-hidden-size / --moe-ffn-hidden-size", kNoRole, at_least(1)},
       {"fault-kill-during-save", &C::fault_kill_during_save,
        "Testing crash safety: RANK:ITERATION makes that rank SIGKILL itself in the middle of that save"}});
  return t;
}

template <class T>
using Member = T TrainConfig::*;

}  // namespace

const std::vector<FlagSpec>& flag_table() {
  static const std::vector<FlagSpec> table = build_flag_table();
  return table;
}

const FlagSpec* find_flag(const std::string& name) {
  for (const auto& f : flag_table())
    if (f.name == name) return &f;
  return nullptr;
}

const FlagSpec& flag_of(const FlagSpec::Field& field) {
  for (const auto& f : flag_table())
    if (f.field == field) return f;
  MOE_ASSERT_MSG(false, "a TrainConfig field without a flag");
}

std::string group_name(FlagGroup g) {
  static const char* const names[] = {"Model",
                                      "Mixture of experts",
                                      "Parallelism",
                                      "Optimizer and schedule",
                                      "Data",
                                      "Checkpoints",
                                      "Evaluation, logging and generation"};
  return names[static_cast<int>(g)];
}

std::vector<std::string> flag_names(unsigned roles, std::optional<FlagGroup> group) {
  std::vector<std::string> names;
  for (const auto& f : flag_table())
    if ((f.roles & roles) == roles && (!group || f.group == *group)) names.push_back(f.name);
  return names;
}

int64_t to_int(const std::string& flag, const std::string& v) {
  try {
    size_t pos = 0;
    const long long x = std::stoll(v, &pos);
    MOE_CHECK(pos == v.size(), "");
    return x;
  } catch (...) {
    MOE_CHECK(false, "--{} expects an integer, got '{}'", flag, v);
  }
  return 0;
}

double to_double(const std::string& flag, const std::string& v) {
  try {
    size_t pos = 0;
    const double x = std::stod(v, &pos);
    MOE_CHECK(pos == v.size(), "");
    return x;
  } catch (...) {
    MOE_CHECK(false, "--{} expects a number, got '{}'", flag, v);
  }
  return 0;
}

void set_flag(TrainConfig& c, const FlagSpec& f, const std::vector<std::string>& vals) {
  const bool list = std::holds_alternative<Member<std::vector<std::string>>>(f.field);
  MOE_CHECK(list || vals.size() == 1, "--{} takes one value, got {}", f.name, vals.size());
  std::visit(
      [&](auto m) {
        using T = std::decay_t<decltype(c.*m)>;
        if constexpr (std::is_same_v<T, int64_t>) {
          c.*m = to_int(f.name, vals[0]);
        } else if constexpr (std::is_same_v<T, double>) {
          c.*m = to_double(f.name, vals[0]);
        } else if constexpr (std::is_same_v<T, bool>) {
          const std::string& v = vals[0];
          MOE_CHECK(v == "true" || v == "false" || v == "1" || v == "0", "--{} expects true or false, got '{}'", f.name,
                    v);
          c.*m = v == "true" || v == "1";
        } else if constexpr (std::is_same_v<T, std::string>) {
          c.*m = vals[0];
        } else {
          c.*m = vals;
        }
      },
      f.field);
}

std::string Accepts::describe() const {
  if (!choices.empty()) {
    std::string s;
    for (const auto& ch : choices) s += (s.empty() ? "" : ", ") + (ch.empty() ? std::string("\"\"") : ch);
    return "one of: " + s;
  }
  if (min == -kInf && max == kInf) return "";
  if (max == kInf) return fmt::format("{} {}", min_open ? ">" : ">=", min);
  if (min == -kInf) return fmt::format("{} {}", max_open ? "<" : "<=", max);
  return fmt::format("in {}{}, {}{}", min_open ? "(" : "[", min, max, max_open ? ")" : "]");
}

void check_accepted(const TrainConfig& c, const FlagSpec& f) {
  const Accepts& a = f.accepts;
  auto number = [&](double v, const std::string& shown) {
    MOE_CHECK(std::isfinite(v), "--{} {} is not a finite number; accepted: {}", f.name, shown,
              a.any() ? "any finite number" : a.describe());
    const bool ok = (a.min_open ? v > a.min : v >= a.min) && (a.max_open ? v < a.max : v <= a.max);
    MOE_CHECK(ok, "--{} {} is out of range; accepted: {}", f.name, shown, a.describe());
  };
  auto text = [&](const std::string& v) {
    MOE_CHECK(a.choices.empty() || std::find(a.choices.begin(), a.choices.end(), v) != a.choices.end(),
              "--{} {} is not accepted; {}", f.name, v.empty() ? "''" : v, a.describe());
  };
  std::visit(
      [&](auto m) {
        using T = std::decay_t<decltype(c.*m)>;
        if constexpr (std::is_same_v<T, int64_t>) {
          number(static_cast<double>(c.*m), std::to_string(c.*m));
        } else if constexpr (std::is_same_v<T, double>) {
          number(c.*m, fmt::format("{}", c.*m));
        } else if constexpr (std::is_same_v<T, std::string>) {
          text(c.*m);
        } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
          for (const auto& v : c.*m) text(v);
        }
      },
      f.field);
}

std::string flag_value(const TrainConfig& c, const FlagSpec& f) {
  return std::visit(
      [&](auto m) -> std::string {
        using T = std::decay_t<decltype(c.*m)>;
        if constexpr (std::is_same_v<T, bool>) {
          return c.*m ? "true" : "false";
        } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
          std::string s;
          for (const auto& v : c.*m) s += (s.empty() ? "" : " ") + v;
          return s;
        } else {
          return fmt::format("{}", c.*m);
        }
      },
      f.field);
}

void apply_flags(TrainConfig& c, const FlagLayer& layer) {
  for (const auto& [name, vals] : layer.values) {
    const FlagSpec* f = find_flag(name);
    MOE_ASSERT_MSG(f != nullptr, "{}: '{}' is not a flag", layer.source, name);
    set_flag(c, *f, vals);
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

nlohmann::json config_json(const TrainConfig& c) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& f : flag_table()) std::visit([&](auto m) { j[f.name] = c.*m; }, f.field);
  return j;
}

void apply_config_json(TrainConfig& c, const nlohmann::json& j, const std::string& where) {
  MOE_CHECK(j.is_object(), "{}: the configuration is not an object", where);
  for (const auto& f : flag_table()) {
    if (!j.contains(f.name)) continue;
    const auto& v = j[f.name];
    try {
      std::visit([&](auto m) { c.*m = v.get<std::decay_t<decltype(c.*m)>>(); }, f.field);
    } catch (const nlohmann::json::exception&) {
      MOE_CHECK(false, "{}: '{}' has the wrong type ({})", where, f.name, v.dump());
    }
  }
}

std::string describe(const TrainConfig& c) {
  std::string s;
  for (const auto& f : flag_table()) {
    const bool derived =
        std::any_of(c.derived.begin(), c.derived.end(), [&](const auto& d) { return d.first == f.name; });
    s += fmt::format("  {:.<42} {}{}\n", f.name + " ", flag_value(c, f), derived ? " (derived)" : "");
  }
  return s;
}

int64_t padded_vocab_size(const TrainConfig& c, int64_t vocab) {
  int64_t m = 0, padded = 0;
  MOE_CHECK(!__builtin_mul_overflow(c.make_vocab_size_divisible_by, c.tensor_model_parallel_size, &m) &&
                !__builtin_add_overflow(vocab, std::max<int64_t>(1, m) - 1, &padded),
            "--vocab-size {} padded to a multiple of --make-vocab-size-divisible-by {} x --tensor-model-parallel-size "
            "{} overflows; use smaller values",
            vocab, c.make_vocab_size_divisible_by, c.tensor_model_parallel_size);
  m = std::max<int64_t>(1, m);
  return padded / m * m;
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
