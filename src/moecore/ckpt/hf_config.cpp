// HuggingFace config.json <-> moecore flags for Qwen3-MoE and Mixtral; DeepSeek-V3's are in hf_deepseek.cpp (see
// hf.h).
#include <fmt/format.h>

#include <algorithm>

#include "moecore/ckpt/hf_util.h"
#include "moecore/moe/moe_layer.h"

namespace moecore::ckpt {

using hf::deepseek_architecture;
using hf::deepseek_architecture_from_flags;
using hf::deepseek_config_from_flags;
using hf::deepseek_train_flags;
using hf::get;
using hf::kind_of;
using hf::layer_freq;
using hf::need;
using hf::refuse_listed;
using hf::refuse_unexpressible;
using hf::shared_hf_config;
using hf::shared_train_flags;

HFArchitecture hf_architecture(const nlohmann::json& c, const std::string& where) {
  if (kind_of(c, where) == "deepseek_v3") return deepseek_architecture(c, where);
  HFArchitecture a;
  a.kind = kind_of(c, where);
  a.layers = need<int64_t>(c, "num_hidden_layers", where);
  a.hidden = need<int64_t>(c, "hidden_size", where);
  a.heads = need<int64_t>(c, "num_attention_heads", where);
  a.kv_heads = get<int64_t>(c, "num_key_value_heads", a.heads, where);
  a.head_dim = get<int64_t>(c, "head_dim", a.hidden / std::max<int64_t>(1, a.heads), where);
  a.vocab = need<int64_t>(c, "vocab_size", where);
  a.tied = get<bool>(c, "tie_word_embeddings", false, where);
  MOE_CHECK(get<std::string>(c, "hidden_act", "silu", where) == "silu", "{}: hidden_act '{}' is not supported (silu)",
            where, c["hidden_act"].dump());
  MOE_CHECK(!c.contains("rope_scaling") || c["rope_scaling"].is_null(),
            "{}: rope_scaling {} is not supported (plain RoPE only)", where,
            c.contains("rope_scaling") ? c["rope_scaling"].dump() : "");
  MOE_CHECK(!get<bool>(c, "attention_bias", false, where), "{}: attention_bias is not supported", where);
  a.is_moe.assign(static_cast<size_t>(a.layers), true);
  if (a.kind == "qwen3_moe") {
    a.qk_norm = true;
    a.ffn = need<int64_t>(c, "intermediate_size", where);
    a.moe_ffn = need<int64_t>(c, "moe_intermediate_size", where);
    a.experts = need<int64_t>(c, "num_experts", where);
    MOE_CHECK(!get<bool>(c, "use_sliding_window", false, where), "{}: use_sliding_window is not supported", where);
    const int64_t step = get<int64_t>(c, "decoder_sparse_step", 1, where);
    MOE_CHECK(step >= 1, "{}: decoder_sparse_step must be >= 1", where);
    const auto dense = get<std::vector<int64_t>>(c, "mlp_only_layers", {}, where);
    for (int64_t i = 0; i < a.layers; i++)
      a.is_moe[static_cast<size_t>(i)] =
          std::find(dense.begin(), dense.end(), i) == dense.end() && a.experts > 0 && (i + 1) % step == 0;
  } else {
    a.moe_ffn = a.ffn = need<int64_t>(c, "intermediate_size", where);
    a.experts = need<int64_t>(c, "num_local_experts", where);
    const int64_t window = get<int64_t>(c, "sliding_window", 0, where);
    const int64_t max_pos = get<int64_t>(c, "max_position_embeddings", 0, where);
    MOE_CHECK(window == 0 || window >= max_pos,
              "{}: sliding_window {} is not supported (below max_position_embeddings {})", where, window, max_pos);
  }
  MOE_CHECK(a.experts > 0, "{}: no experts", where);
  return a;
}

nlohmann::json hf_train_flags(const nlohmann::json& c, const std::string& where) {
  const HFArchitecture a = hf_architecture(c, where);
  if (a.kind == "deepseek_v3") return deepseek_train_flags(c, a, where);
  nlohmann::json f = shared_train_flags(a);
  f.update({{"group-query-attention", a.kv_heads != a.heads},
            {"num-query-groups", a.kv_heads},
            {"kv-channels", a.head_dim},
            {"qk-layernorm", a.qk_norm},
            {"moe-router-topk", need<int64_t>(c, "num_experts_per_tok", where)},
            {"moe-router-score-function", "softmax"},
            {"rotary-base", get<double>(c, "rope_theta", a.kind == "mixtral" ? 1e6 : 1e4, where)},
            {"norm-epsilon", get<double>(c, "rms_norm_eps", a.kind == "mixtral" ? 1e-5 : 1e-6, where)},
            // HF Qwen3-MoE and Mixtral drop only attention probabilities (attention_dropout, 0.0 in their released
            // configs); they have no hidden dropout.
            {"attention-dropout", get<double>(c, "attention_dropout", 0.0, where)}});
  if (c.contains("max_position_embeddings"))
    f["max-position-embeddings"] = need<int64_t>(c, "max_position_embeddings", where);
  // Qwen3-MoE: softmax over all experts, top-k, renormalized when norm_topk_prob (Megatron's default top-k then
  // softmax), kept as they are otherwise (Megatron's --moe-router-pre-softmax). Mixtral always renormalizes.
  f["moe-router-pre-softmax"] = a.kind == "qwen3_moe" && !get<bool>(c, "norm_topk_prob", false, where);
  if (a.kind == "mixtral") f["moe-input-jitter-eps"] = get<double>(c, "router_jitter_noise", 0.0, where);
  return f;
}

HFArchitecture architecture_from_flags(const nlohmann::json& f, int64_t vocab, std::string kind) {
  const std::string where = "the checkpoint's configuration";
  if (kind.empty() && get<bool>(f, "multi-latent-attention", false, where)) kind = "deepseek_v3";
  if (kind == "deepseek_v3") return deepseek_architecture_from_flags(f, vocab);
  auto i = [&](const char* k) { return need<int64_t>(f, k, where); };
  auto b = [&](const char* k) { return get<bool>(f, k, false, where); };
  HFArchitecture a;
  a.layers = i("num-layers");
  a.hidden = i("hidden-size");
  a.heads = i("num-attention-heads");
  a.kv_heads = b("group-query-attention") ? i("num-query-groups") : a.heads;
  a.head_dim = get<int64_t>(f, "kv-channels", 0, where);
  if (a.head_dim == 0) a.head_dim = a.hidden / a.heads;
  a.ffn = get<int64_t>(f, "ffn-hidden-size", 0, where);
  a.experts = get<int64_t>(f, "num-experts", 0, where);
  a.moe_ffn = get<int64_t>(f, "moe-ffn-hidden-size", 0, where);
  if (a.moe_ffn == 0) a.moe_ffn = a.ffn;
  a.vocab = vocab;
  a.tied = !b("untie-embeddings-and-output-weights");
  a.qk_norm = b("qk-layernorm");
  std::vector<std::string> refused;
  auto refuse_if = [&](bool bad, const std::string& what) {
    if (bad) refused.push_back(what);
  };
  refuse_unexpressible(f, refused);
  refuse_if(get<int64_t>(f, "moe-shared-expert-intermediate-size", 0, where) > 0, "shared experts");
  refuse_if(get<std::string>(f, "moe-router-score-function", "softmax", where) != "softmax", "sigmoid routing");
  refuse_if(b("moe-router-enable-expert-bias"), "expert bias");
  refuse_if(get<double>(f, "moe-router-topk-scaling-factor", 0.0, where) != 0.0, "a top-k scaling factor");
  refuse_if(get<int64_t>(f, "moe-router-num-groups", 0, where) > 0, "group-limited routing");
  refuse_if(get<double>(f, "rotary-percent", 1.0, where) != 1.0, "partial RoPE");
  refuse_if(get<bool>(f, "multi-latent-attention", false, where), "multi-latent attention (--arch deepseek-v3)");
  refuse_if(get<int64_t>(f, "mtp-num-layers", 0, where) > 0, "multi-token prediction (--arch deepseek-v3)");
  if (a.experts > 0) a.is_moe = moe::parse_moe_layer_freq(get<std::string>(f, "moe-layer-freq", "1", where), a.layers);
  if (kind.empty()) kind = a.qk_norm ? "qwen3_moe" : "mixtral";
  a.kind = kind;
  if (kind == "mixtral") {
    refuse_if(a.qk_norm, "qk-layernorm");
    refuse_if(std::find(a.is_moe.begin(), a.is_moe.end(), false) != a.is_moe.end(), "dense layers");
    refuse_if(b("moe-router-pre-softmax"), "pre-softmax routing (Mixtral renormalizes the top-k)");
  } else if (kind == "qwen3_moe") {
    refuse_if(!a.qk_norm, "no qk-layernorm (Qwen3 normalizes queries and keys)");
  } else {
    MOE_CHECK(false, "--arch {} is not supported; use qwen3-moe, mixtral or deepseek-v3", kind);
  }
  refuse_listed(refused, kind);
  return a;
}

nlohmann::json hf_config_from_flags(const nlohmann::json& f, const HFArchitecture& a, const std::string& dtype) {
  if (a.kind == "deepseek_v3") return deepseek_config_from_flags(f, a, dtype);
  const std::string where = "the checkpoint's configuration";
  nlohmann::json c = shared_hf_config(f, a, dtype);
  c["head_dim"] = a.head_dim;
  if (a.kind == "qwen3_moe") {
    std::vector<int64_t> dense;
    for (size_t i = 0; i < a.is_moe.size(); i++)
      if (!a.is_moe[i]) dense.push_back(static_cast<int64_t>(i));
    c["architectures"] = {"Qwen3MoeForCausalLM"};
    c["model_type"] = "qwen3_moe";
    c["intermediate_size"] = a.ffn;
    c["moe_intermediate_size"] = a.moe_ffn;
    c["num_experts"] = a.experts;
    c["norm_topk_prob"] = !get<bool>(f, "moe-router-pre-softmax", false, where);
    c["decoder_sparse_step"] = 1;
    c["mlp_only_layers"] = dense;
    c["attention_bias"] = false;
    c["use_sliding_window"] = false;
    c["sliding_window"] = nullptr;
    c["output_router_logits"] = false;
  } else {
    c["architectures"] = {"MixtralForCausalLM"};
    c["model_type"] = "mixtral";
    c["intermediate_size"] = a.moe_ffn;
    c["num_local_experts"] = a.experts;
    c["sliding_window"] = nullptr;
    c["router_jitter_noise"] = get<double>(f, "moe-input-jitter-eps", 0.0, where);
    c["output_router_logits"] = false;
  }
  return c;
}

}  // namespace moecore::ckpt
