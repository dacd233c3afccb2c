// Training configuration (see config.h): what derives from the flag table directly: values from strings and
// back, the JSON form checkpoints store, the printed configuration, and the module configs. Not here: the table
// itself (flag_table.cpp), the CLI11/YAML parser (flag_parser.cpp), the two resolve passes (config_resolve.cpp).
#include "moecore/train/config/config.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <optional>

#include "moecore/core/error.h"

namespace moecore::train {

namespace {

template <class T>
using Member = T TrainConfig::*;

}  // namespace

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
  if (c.padded_vocab_size > 0) {
    MOE_CHECK(c.padded_vocab_size >= vocab,
              "--padded-vocab-size {} is smaller than the vocabulary ({} token ids); give at least {}, or leave it out "
              "to pad by --make-vocab-size-divisible-by",
              c.padded_vocab_size, vocab, vocab);
    return c.padded_vocab_size;
  }
  int64_t m = 0, padded = 0;
  MOE_CHECK(!__builtin_mul_overflow(c.make_vocab_size_divisible_by, c.tensor_model_parallel_size, &m) &&
                !__builtin_add_overflow(vocab, std::max<int64_t>(1, m) - 1, &padded),
            "--vocab-size {} padded to a multiple of --make-vocab-size-divisible-by {} x --tensor-model-parallel-size "
            "{} overflows; use smaller values",
            vocab, c.make_vocab_size_divisible_by, c.tensor_model_parallel_size);
  m = std::max<int64_t>(1, m);
  return padded / m * m;
}

LowPrecision low_precision(const TrainConfig& c) {
  if (c.bf16) return DType::BF16;
  if (c.fp16) return DType::F16;
  return std::nullopt;
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
  g.normalization = nn::parse_norm_kind(c.normalization);
  g.zero_centered_gamma = c.apply_layernorm_1p;
  g.position_embedding = nn::parse_position_embedding_type(c.position_embedding_type);
  g.init_method_std = c.init_method_std;
  g.activation = c.swiglu ? kernels::Activation::SwiGLU
                          : (c.squared_relu ? kernels::Activation::SquaredReLU : kernels::Activation::GeLU);
  g.add_bias_linear = !c.disable_bias_linear;
  g.low = low_precision(c);
  g.hidden_dropout = c.hidden_dropout;
  g.attention_dropout = c.attention_dropout;
  g.seed = static_cast<uint64_t>(c.seed);
  g.mtp.num_layers = c.mtp_num_layers, g.mtp.loss_scaling_factor = c.mtp_loss_scaling_factor;
  // Megatron checkpoints the MTP layer under full uniform recompute (block: not recomputed, with a warning).
  g.mtp.recompute = c.recompute_granularity == "full" && c.recompute_method == "uniform";
  g.mla.enabled = c.multi_latent_attention;
  g.mla.q_lora_rank = c.q_lora_rank, g.mla.kv_lora_rank = c.kv_lora_rank, g.mla.qk_head_dim = c.qk_head_dim;
  g.mla.qk_pos_emb_head_dim = c.qk_pos_emb_head_dim, g.mla.v_head_dim = c.v_head_dim;
  g.mla.yarn = c.rope_type != "rope";  // unset: yarn, Megatron's MLA default
  // MLATransformerConfig's beta_fast, beta_slow and original context (defaults 32, 1, 4096) from the --yarn-* flags,
  // which in Megatron reach only --position-embedding-type yarn (docs/differences.md).
  g.mla.yarn_params.scaling_factor = c.rotary_scaling_factor;
  g.mla.yarn_params.mscale = c.mscale, g.mla.yarn_params.mscale_all_dim = c.mscale_all_dim;
  g.mla.yarn_params.beta_fast = c.yarn_beta_fast, g.mla.yarn_params.beta_slow = c.yarn_beta_slow;
  g.mla.yarn_params.original_max_position_embeddings = c.yarn_original_max_position_embeddings;
  return g;
}

moe::RouterConfig router_config(const TrainConfig& c) {
  moe::RouterConfig r;
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
  r.load_balancing.clear();  // RouterConfig's own defaults replaced, not extended
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
  return r;
}

bool combined_1f1b(const TrainConfig& c) {
  return c.overlap_moe_expert_parallel_comm && !c.delay_wgrad_compute;
}

moe::MoELayerConfig moe_layer_config(const TrainConfig& c) {
  moe::MoELayerConfig m;
  m.router = router_config(c);
  m.ffn_hidden = c.moe_ffn_hidden_size > 0 ? c.moe_ffn_hidden_size : c.ffn_hidden_size;
  m.shared_ffn_hidden = c.moe_shared_expert_intermediate_size;
  m.shared_expert_gate = c.moe_shared_expert_gate;
  m.shared_expert_overlap = c.moe_shared_expert_overlap;
  m.overlap_dispatch_backward =
      (c.overlap_moe_expert_parallel_comm && c.delay_wgrad_compute) || c.overlap_dispatch_backward_with_experts_wgrad;
  m.activation = c.swiglu ? kernels::Activation::SwiGLU
                          : (c.squared_relu ? kernels::Activation::SquaredReLU : kernels::Activation::GeLU);
  m.init_std = c.init_method_std;
  m.output_init_std = c.init_method_std / std::sqrt(2.0 * static_cast<double>(c.num_layers));
  m.low = low_precision(c);
  m.bias = !c.disable_bias_linear;
  m.allgather_dispatcher = c.moe_token_dispatcher_type == "allgather";
  m.flex_dispatcher = c.moe_token_dispatcher_type == "flex";
  return m;
}

optim::LRSchedule lr_schedule(const TrainConfig& c) {
  // Megatron's get_optimizer_param_scheduler: the scheduler counts samples, iteration flags times the global batch.
  optim::LRSchedule s;
  const int64_t gbs = c.global_batch_size;
  s.init_lr = c.lr_warmup_init;
  s.max_lr = c.lr;
  s.min_lr = c.min_lr;
  s.style = c.lr_decay_style;
  s.wsd_style = c.lr_wsd_decay_style;
  if (c.train_samples == 0) {
    s.decay_iters = (c.lr_decay_iters > 0 ? c.lr_decay_iters : c.train_iters) * gbs;
    s.wd_incr_steps = c.train_iters * gbs;
    s.wsd_decay_iters = c.lr_wsd_decay_iters * gbs;
    s.warmup_iters = static_cast<double>(c.lr_warmup_iters * gbs);
  } else {
    s.decay_iters = c.lr_decay_samples > 0 ? c.lr_decay_samples : c.train_samples;
    s.wd_incr_steps = c.train_samples;
    s.wsd_decay_iters = c.lr_wsd_decay_samples;
    s.warmup_iters = static_cast<double>(c.lr_warmup_samples);
  }
  if (c.lr_warmup_fraction >= 0) s.warmup_iters = c.lr_warmup_fraction * static_cast<double>(s.decay_iters);
  s.wd_incr_style = c.weight_decay_incr_style;
  const bool constant = c.weight_decay_incr_style == "constant";
  s.start_wd = constant ? c.weight_decay : c.start_weight_decay;
  s.end_wd = constant ? c.weight_decay : c.end_weight_decay;
  return s;
}

}  // namespace moecore::train
