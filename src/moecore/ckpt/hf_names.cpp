// The HF-name maps of Qwen3-MoE and Mixtral, and the pieces every architecture's map is made of (see hf.h).
#include <fmt/format.h>

#include "moecore/ckpt/hf_util.h"

namespace moecore::ckpt {

namespace hf {

std::string kind_of(const nlohmann::json& c, const std::string& where) {
  const std::string mt = get<std::string>(c, "model_type", "", where);
  std::string arch;
  if (c.contains("architectures") && c["architectures"].is_array() && !c["architectures"].empty())
    arch = c["architectures"][0].is_string() ? c["architectures"][0].get<std::string>() : "";
  if (mt == "qwen3_moe" || arch == "Qwen3MoeForCausalLM") return "qwen3_moe";
  if (mt == "mixtral" || arch == "MixtralForCausalLM") return "mixtral";
  // Kimi-K2's config.json says model_type kimi_k2 with the DeepseekV3ForCausalLM architecture.
  if (mt == "deepseek_v3" || arch == "DeepseekV3ForCausalLM") return "deepseek_v3";
  MOE_CHECK(false,
            "{}: model_type '{}' ({}) is not supported; moecore converts Qwen3MoeForCausalLM, MixtralForCausalLM and "
            "DeepseekV3ForCausalLM (DeepSeek-V3, Kimi-K2)",
            where, mt, arch.empty() ? "no architectures" : arch);
  return "";
}

void add_whole(std::vector<NativeTensor>& out, const std::string& name, const Shape& s, const std::string& hf) {
  out.push_back({name, s, {{hf, s, whole_box(s)}}});
}

void add_swiglu_mlp(std::vector<NativeTensor>& out, const std::string& n, const std::string& h, int64_t F, int64_t H) {
  out.push_back({n + "linear_fc1.weight",
                 {2, F, H},
                 {{h + "gate_proj.weight", {F, H}, box({2, F, H}, {0, 0, 0}, {1, F, H})},
                  {h + "up_proj.weight", {F, H}, box({2, F, H}, {1, 0, 0}, {1, F, H})}}});
  add_whole(out, n + "linear_fc2.weight", {H, F}, h + "down_proj.weight");
}

void add_experts(std::vector<NativeTensor>& out, const std::string& n, const std::string& h, int64_t E, int64_t F,
                 int64_t H, const char* gate, const char* up, const char* down) {
  NativeTensor fc1{n + "linear_fc1.weight", {E, 2, F, H}, {}};
  NativeTensor fc2{n + "linear_fc2.weight", {E, H, F}, {}};
  for (int64_t e = 0; e < E; e++) {
    const std::string x = fmt::format("{}experts.{}.", h, e);
    fc1.pieces.push_back({x + gate, {F, H}, box(fc1.global, {e, 0, 0, 0}, {1, 1, F, H})});
    fc1.pieces.push_back({x + up, {F, H}, box(fc1.global, {e, 1, 0, 0}, {1, 1, F, H})});
    fc2.pieces.push_back({x + down, {H, F}, box(fc2.global, {e, 0, 0}, {1, H, F})});
  }
  out.push_back(fc1);
  out.push_back(fc2);
}

nlohmann::json shared_train_flags(const HFArchitecture& a) {
  return {{"num-layers", a.layers},
          {"hidden-size", a.hidden},
          {"num-attention-heads", a.heads},
          {"untie-embeddings-and-output-weights", !a.tied},
          {"swiglu", true},
          {"squared-relu", false},
          {"disable-bias-linear", true},
          {"num-experts", a.experts},
          {"ffn-hidden-size", a.ffn},
          {"moe-ffn-hidden-size", a.moe_ffn},
          {"moe-layer-freq", layer_freq(a.is_moe)},
          {"rotary-percent", 1.0},
          {"normalization", "RMSNorm"},  // not Megatron's defaults
          {"position-embedding-type", "rope"},
          {"hidden-dropout", 0.0}};  // the HF classes drop only attention probabilities (attention_dropout)
}

nlohmann::json shared_hf_config(const nlohmann::json& f, const HFArchitecture& a, const std::string& dtype) {
  const std::string where = "the checkpoint's configuration";
  return {{"hidden_size", a.hidden},
          {"num_hidden_layers", a.layers},
          {"num_attention_heads", a.heads},
          {"num_key_value_heads", a.kv_heads},
          {"vocab_size", a.vocab},
          {"tie_word_embeddings", a.tied},
          {"hidden_act", "silu"},
          {"rms_norm_eps", get<double>(f, "norm-epsilon", 1e-5, where)},
          {"rope_theta", get<double>(f, "rotary-base", 1e4, where)},
          {"rope_scaling", nullptr},
          {"max_position_embeddings", get<int64_t>(f, "max-position-embeddings", 4096, where)},
          {"num_experts_per_tok", get<int64_t>(f, "moe-router-topk", 2, where)},
          {"attention_dropout", get<double>(f, "attention-dropout", 0.0, where)},
          {"initializer_range", get<double>(f, "init-method-std", 0.02, where)},
          {"torch_dtype", dtype == "f32" ? "float32" : "bfloat16"},
          {"use_cache", true}};
}

void refuse_unexpressible(const nlohmann::json& f, std::vector<std::string>& refused) {
  const std::string where = "the checkpoint's configuration";
  auto refuse_if = [&](bool bad, const std::string& what) {
    if (bad) refused.push_back(what);
  };
  refuse_if(get<int64_t>(f, "num-experts", 0, where) == 0, "a dense model (no --num-experts)");
  refuse_if(!get<bool>(f, "swiglu", false, where), "a non-SwiGLU FFN");
  refuse_if(!get<bool>(f, "disable-bias-linear", false, where), "linear biases");
  // Checkpoints from before these flags existed hold RMSNorm and rope models.
  refuse_if(get<std::string>(f, "normalization", "RMSNorm", where) != "RMSNorm",
            "LayerNorm (the HF classes use RMSNorm: train with --normalization RMSNorm)");
  refuse_if(get<std::string>(f, "position-embedding-type", "rope", where) != "rope",
            "--position-embedding-type " + get<std::string>(f, "position-embedding-type", "rope", where) +
                " (the HF classes use RoPE: train with --position-embedding-type rope)");
  refuse_if(get<bool>(f, "apply-layernorm-1p", false, where), "zero-centred norm weights (--apply-layernorm-1p)");
}

std::string layer_freq(const std::vector<bool>& is_moe) {
  std::string freq = "[";
  for (size_t i = 0; i < is_moe.size(); i++) freq += fmt::format("{}{}", i ? "," : "", is_moe[i] ? 1 : 0);
  return freq + "]";
}

void refuse_listed(const std::vector<std::string>& refused, const std::string& kind) {
  if (refused.empty()) return;
  std::string list;
  for (const auto& r : refused) list += (list.empty() ? "" : ", ") + r;
  MOE_CHECK(false, "the checkpoint's model cannot be written as {}: it has {}", kind, list);
}

}  // namespace hf

std::vector<NativeTensor> native_tensors(const HFArchitecture& a) {
  if (a.kind == "deepseek_v3") return hf::deepseek_native_tensors(a);
  const int64_t H = a.hidden, D = a.head_dim, V = a.vocab, E = a.experts;
  std::vector<NativeTensor> out;
  auto whole = [&](const std::string& name, const Shape& s, const std::string& hf) { hf::add_whole(out, name, s, hf); };
  whole("embedding.word_embeddings.weight", {V, H}, "model.embed_tokens.weight");
  for (int64_t l = 0; l < a.layers; l++) {
    const std::string n = fmt::format("decoder.layers.{}.", l), h = fmt::format("model.layers.{}.", l);
    whole(n + "input_layernorm.weight", {H}, h + "input_layernorm.weight");
    whole(n + "self_attention.linear_q.weight", {a.heads * D, H}, h + "self_attn.q_proj.weight");
    whole(n + "self_attention.linear_k.weight", {a.kv_heads * D, H}, h + "self_attn.k_proj.weight");
    whole(n + "self_attention.linear_v.weight", {a.kv_heads * D, H}, h + "self_attn.v_proj.weight");
    whole(n + "self_attention.linear_proj.weight", {H, a.heads * D}, h + "self_attn.o_proj.weight");
    if (a.qk_norm) {
      whole(n + "self_attention.q_layernorm.weight", {D}, h + "self_attn.q_norm.weight");
      whole(n + "self_attention.k_layernorm.weight", {D}, h + "self_attn.k_norm.weight");
    }
    whole(n + "pre_mlp_layernorm.weight", {H}, h + "post_attention_layernorm.weight");
    if (!a.is_moe[static_cast<size_t>(l)]) {
      hf::add_swiglu_mlp(out, n + "mlp.", h + "mlp.", a.ffn, H);
      continue;
    }
    const bool mix = a.kind == "mixtral";
    const std::string moe = h + (mix ? "block_sparse_moe." : "mlp.");
    whole(n + "mlp.router.weight", {E, H}, moe + "gate.weight");
    if (mix)
      hf::add_experts(out, n + "mlp.experts.", moe, E, a.moe_ffn, H, "w1.weight", "w3.weight", "w2.weight");
    else
      hf::add_experts(out, n + "mlp.experts.", moe, E, a.moe_ffn, H, "gate_proj.weight", "up_proj.weight",
                      "down_proj.weight");
  }
  whole("decoder.final_layernorm.weight", {H}, "model.norm.weight");
  if (!a.tied) whole("output_layer.weight", {V, H}, "lm_head.weight");
  return out;
}

}  // namespace moecore::ckpt
