// DeepSeek-V3 (HF DeepseekV3ForCausalLM, the class Kimi-K2's checkpoints use too) <-> moecore: config.json to
// Megatron's MLA/MoE/MTP flags and back, and the name map (see hf.h). HF's DeepseekV3 semantics that Megatron cannot
// express are refused by name: softmax or bias-free routing, group scores over other than each group's top 2,
// unnormalized sigmoid top-k, dense layers after MoE ones, other RoPE scalings.
#include <fmt/format.h>

#include "moecore/ckpt/hf_util.h"
#include "moecore/moe/moe_layer.h"

namespace moecore::ckpt::hf {

namespace {

const std::string kFlagsWhere = "the checkpoint's configuration";

// HF's RoPE parameters: rope_scaling (transformers 4) or rope_parameters (5); null or type "default": plain RoPE.
nlohmann::json rope_parameters(const nlohmann::json& c, const std::string& where) {
  for (const char* key : {"rope_scaling", "rope_parameters"})
    if (c.contains(key) && !c[key].is_null()) {
      MOE_CHECK(c[key].is_object(), "{}: '{}' must be an object", where, key);
      return c[key];
    }
  return nlohmann::json::object();
}

std::string rope_type(const nlohmann::json& r, const std::string& where) {
  return get<std::string>(r, "rope_type", get<std::string>(r, "type", "default", where), where);
}

// HF's attention factor is mscale(s, mscale)/mscale(s, mscale_all_dim) only when both are non-zero, else mscale(s);
// Megatron's (moecore's) is the ratio always. The two agree in these cases.
bool mscale_agrees(double mscale, double mscale_all_dim) {
  return (mscale != 0 && mscale_all_dim != 0) || (mscale == 1 && mscale_all_dim == 0);
}

}  // namespace

HFArchitecture deepseek_architecture(const nlohmann::json& c, const std::string& where) {
  HFArchitecture a;
  a.kind = "deepseek_v3";
  a.layers = need<int64_t>(c, "num_hidden_layers", where);
  a.hidden = need<int64_t>(c, "hidden_size", where);
  a.heads = a.kv_heads = need<int64_t>(c, "num_attention_heads", where);
  a.vocab = need<int64_t>(c, "vocab_size", where);
  a.tied = get<bool>(c, "tie_word_embeddings", false, where);
  a.ffn = need<int64_t>(c, "intermediate_size", where);
  a.moe_ffn = need<int64_t>(c, "moe_intermediate_size", where);
  a.experts = need<int64_t>(c, "n_routed_experts", where);
  MOE_CHECK(c.contains("q_lora_rank"), "{}: 'q_lora_rank' is missing (null for a direct q projection)", where);
  a.q_lora = get<int64_t>(c, "q_lora_rank", 0, where);
  a.kv_lora = need<int64_t>(c, "kv_lora_rank", where);
  a.qk_nope = need<int64_t>(c, "qk_nope_head_dim", where);
  a.qk_rope = need<int64_t>(c, "qk_rope_head_dim", where);
  a.v_dim = need<int64_t>(c, "v_head_dim", where);
  const int64_t shared = get<int64_t>(c, "n_shared_experts", 0, where);
  MOE_CHECK(shared >= 0 && shared <= 64, "{}: n_shared_experts {} is out of range [0, 64]", where, shared);
  MOE_CHECK(a.moe_ffn > 0 && a.moe_ffn <= (int64_t{1} << 30), "{}: moe_intermediate_size {} is out of range", where,
            a.moe_ffn);
  a.shared_ffn = shared * a.moe_ffn;
  a.mtp_layers = get<int64_t>(c, "num_nextn_predict_layers", 0, where);
  a.expert_bias = a.qk_norm = true;  // noaux_tc's e_score_correction_bias; q_a_layernorm and kv_a_layernorm
  for (int64_t v : {a.layers, a.hidden, a.heads, a.vocab, a.ffn, a.moe_ffn, a.experts, a.kv_lora, a.qk_rope, a.v_dim})
    MOE_CHECK(v > 0, "{}: every size must be positive", where);
  MOE_CHECK(a.q_lora >= 0 && a.qk_nope >= 0 && a.shared_ffn >= 0 && a.mtp_layers >= 0 && a.mtp_layers <= 64,
            "{}: q_lora_rank, qk_nope_head_dim, n_shared_experts and num_nextn_predict_layers must not be negative",
            where);
  MOE_CHECK(a.layers <= 4096 && a.experts <= 65536, "{}: {} layers of {} experts is beyond what moecore builds", where,
            a.layers, a.experts);
  MOE_CHECK(get<std::string>(c, "hidden_act", "silu", where) == "silu", "{}: hidden_act '{}' is not supported (silu)",
            where, c["hidden_act"].dump());
  MOE_CHECK(!get<bool>(c, "attention_bias", false, where), "{}: attention_bias is not supported", where);
  MOE_CHECK(get<bool>(c, "rope_interleave", true, where),
            "{}: rope_interleave false is not supported (DeepSeek-V3 rotates interleaved pairs)", where);
  MOE_CHECK(get<std::string>(c, "topk_method", "noaux_tc", where) == "noaux_tc",
            "{}: topk_method '{}' is not supported (DeepSeek-V3's noaux_tc: sigmoid scores plus the expert bias)",
            where, c["topk_method"].dump());
  MOE_CHECK(get<std::string>(c, "scoring_func", "sigmoid", where) == "sigmoid",
            "{}: scoring_func '{}' is not supported (sigmoid)", where, c["scoring_func"].dump());
  MOE_CHECK(get<int64_t>(c, "moe_layer_freq", 1, where) == 1, "{}: moe_layer_freq other than 1 is not supported",
            where);
  const int64_t topk = need<int64_t>(c, "num_experts_per_tok", where);
  MOE_CHECK(topk >= 1 && topk <= a.experts, "{}: num_experts_per_tok {} must be in [1, n_routed_experts {}]", where,
            topk, a.experts);
  // Megatron normalizes a sigmoid top-k whenever k > 1.
  MOE_CHECK(topk == 1 || get<bool>(c, "norm_topk_prob", true, where),
            "{}: norm_topk_prob false is not supported (Megatron normalizes the sigmoid top-k weights)", where);
  const int64_t groups = get<int64_t>(c, "n_group", 1, where), group_topk = get<int64_t>(c, "topk_group", 1, where);
  if (groups > 1) {
    MOE_CHECK(a.experts % groups == 0 && group_topk >= 1 && group_topk <= groups,
              "{}: n_group {} and topk_group {} do not divide n_routed_experts {}", where, groups, group_topk,
              a.experts);
    // HF scores each group by the sum of its top 2; Megatron by the sum of its top k / topk_group.
    MOE_CHECK(topk / group_topk == 2,
              "{}: num_experts_per_tok {} / topk_group {} must be 2 (HF sums each group's top 2 scores, Megatron its "
              "top num_experts_per_tok / topk_group)",
              where, topk, group_topk);
  }
  const nlohmann::json rope = rope_parameters(c, where);
  const std::string rt = rope_type(rope, where);
  MOE_CHECK(rt == "default" || rt == "yarn", "{}: RoPE scaling '{}' is not supported (yarn or none)", where, rt);
  if (rt == "yarn") {
    const double ms = get<double>(rope, "mscale", 1.0, where), mad = get<double>(rope, "mscale_all_dim", 0.0, where);
    MOE_CHECK(mscale_agrees(ms, mad),
              "{}: rope_scaling mscale {} with mscale_all_dim {} is not supported (HF then uses another attention "
              "factor than Megatron's mscale(s, mscale)/mscale(s, mscale_all_dim))",
              where, ms, mad);
  }
  const int64_t first_dense = get<int64_t>(c, "first_k_dense_replace", 0, where);
  MOE_CHECK(first_dense >= 0, "{}: first_k_dense_replace must not be negative", where);
  a.is_moe.resize(static_cast<size_t>(a.layers));
  for (int64_t i = 0; i < a.layers; i++) a.is_moe[static_cast<size_t>(i)] = i >= first_dense;
  // moecore's MTP layers take the last decoder layer's FFN; HF's layer L+k is MoE from first_k_dense_replace on.
  MOE_CHECK(a.mtp_layers == 0 || (a.layers >= first_dense) == a.is_moe.back(),
            "{}: the MTP layers would be {} after {} last decoder layer; moecore's MTP layers follow the last "
            "decoder layer",
            where, a.layers >= first_dense ? "MoE" : "dense", a.is_moe.back() ? "an MoE" : "a dense");
  return a;
}

nlohmann::json deepseek_train_flags(const nlohmann::json& c, const HFArchitecture& a, const std::string& where) {
  const nlohmann::json rope = rope_parameters(c, where);
  const bool yarn = rope_type(rope, where) == "yarn";
  const int64_t groups = get<int64_t>(c, "n_group", 1, where);
  const double scale = get<double>(c, "routed_scaling_factor", 1.0, where);
  nlohmann::json f = shared_train_flags(a);
  f.update({{"group-query-attention", false},
            {"multi-latent-attention", true},
            {"q-lora-rank", a.q_lora},
            {"kv-lora-rank", a.kv_lora},
            {"qk-head-dim", a.qk_nope},
            {"qk-pos-emb-head-dim", a.qk_rope},
            {"v-head-dim", a.v_dim},
            {"qk-layernorm", true},
            {"rope-type", yarn ? "yarn" : "rope"},
            {"rotary-scaling-factor", yarn ? get<double>(rope, "factor", 1.0, where) : 1.0},
            {"mscale", yarn ? get<double>(rope, "mscale", 1.0, where) : 1.0},
            {"mscale-all-dim", yarn ? get<double>(rope, "mscale_all_dim", 0.0, where) : 0.0},
            {"yarn-beta-fast", yarn ? get<double>(rope, "beta_fast", 32.0, where) : 32.0},
            {"yarn-beta-slow", yarn ? get<double>(rope, "beta_slow", 1.0, where) : 1.0},
            {"yarn-original-max-position-embeddings",
             yarn ? get<int64_t>(rope, "original_max_position_embeddings", 4096, where) : 4096},
            {"rotary-base", get<double>(c, "rope_theta", get<double>(rope, "rope_theta", 1e4, where), where)},
            {"norm-epsilon", get<double>(c, "rms_norm_eps", 1e-6, where)},
            {"moe-shared-expert-intermediate-size", a.shared_ffn},
            {"moe-router-topk", need<int64_t>(c, "num_experts_per_tok", where)},
            {"moe-router-score-function", "sigmoid"},
            {"moe-router-pre-softmax", false},
            {"moe-router-enable-expert-bias", true},
            {"moe-router-topk-scaling-factor", scale == 1.0 ? 0.0 : scale},
            {"moe-router-num-groups", groups > 1 ? groups : 0},
            {"moe-router-group-topk", groups > 1 ? get<int64_t>(c, "topk_group", 1, where) : 0},
            {"mtp-num-layers", a.mtp_layers},
            {"attention-dropout", get<double>(c, "attention_dropout", 0.0, where)}});
  if (c.contains("max_position_embeddings"))
    f["max-position-embeddings"] = need<int64_t>(c, "max_position_embeddings", where);
  return f;
}

HFArchitecture deepseek_architecture_from_flags(const nlohmann::json& f, int64_t vocab) {
  const std::string& where = kFlagsWhere;
  auto i = [&](const char* k, int64_t fallback) { return get<int64_t>(f, k, fallback, where); };
  auto b = [&](const char* k) { return get<bool>(f, k, false, where); };
  auto d = [&](const char* k, double fallback) { return get<double>(f, k, fallback, where); };
  HFArchitecture a;
  a.kind = "deepseek_v3";
  a.layers = need<int64_t>(f, "num-layers", where);
  a.hidden = need<int64_t>(f, "hidden-size", where);
  a.heads = a.kv_heads = need<int64_t>(f, "num-attention-heads", where);
  a.vocab = vocab;
  a.tied = !b("untie-embeddings-and-output-weights");
  a.ffn = i("ffn-hidden-size", 0);
  a.experts = i("num-experts", 0);
  a.moe_ffn = i("moe-ffn-hidden-size", 0);
  if (a.moe_ffn == 0) a.moe_ffn = a.ffn;
  a.shared_ffn = i("moe-shared-expert-intermediate-size", 0);
  // Megatron's command-line defaults where a flag is absent.
  a.q_lora = i("q-lora-rank", 0), a.kv_lora = i("kv-lora-rank", 32), a.qk_nope = i("qk-head-dim", 128);
  a.qk_rope = i("qk-pos-emb-head-dim", 64), a.v_dim = i("v-head-dim", 128);
  a.mtp_layers = i("mtp-num-layers", 0);
  a.expert_bias = b("moe-router-enable-expert-bias");
  a.qk_norm = b("qk-layernorm");
  std::vector<std::string> refused;
  auto refuse_if = [&](bool bad, const std::string& what) {
    if (bad) refused.push_back(what);
  };
  refuse_if(!b("multi-latent-attention"), "no multi-latent attention (--arch qwen3-moe or mixtral)");
  refuse_unexpressible(f, refused);
  refuse_if(!a.qk_norm, "no latent norms (DeepseekV3 normalizes the q and kv latents: --qk-layernorm)");
  refuse_if(get<std::string>(f, "moe-router-score-function", "softmax", where) != "sigmoid",
            "softmax routing (DeepseekV3 routes by sigmoid scores)");
  refuse_if(!a.expert_bias,
            "no expert bias (DeepseekV3 adds e_score_correction_bias: --moe-router-enable-expert-bias)");
  refuse_if(b("moe-shared-expert-gate"), "a shared-expert gate");
  refuse_if(a.shared_ffn % std::max<int64_t>(1, a.moe_ffn) != 0,
            "a shared expert that is not a whole number of experts wide");
  const int64_t group_topk = i("moe-router-group-topk", 0);
  const int64_t topk = i("moe-router-topk", 2);
  refuse_if(group_topk > 0 && topk / group_topk != 2,
            "group scores over each group's top " + std::to_string(group_topk > 0 ? topk / group_topk : 0) +
                " (DeepseekV3 sums the top 2: --moe-router-topk = 2 x --moe-router-group-topk)");
  const bool yarn = get<std::string>(f, "rope-type", "", where) != "rope";
  refuse_if(!yarn && d("rotary-percent", 1.0) != 1.0, "partial RoPE");
  refuse_if(!mscale_agrees(d("mscale", 1.0), d("mscale-all-dim", 0.0)),
            "--mscale with --mscale-all-dim 0 (HF's attention factor then differs)");
  a.is_moe = moe::parse_moe_layer_freq(get<std::string>(f, "moe-layer-freq", "1", where), a.layers);
  int64_t first_dense = 0;
  while (first_dense < a.layers && !a.is_moe[static_cast<size_t>(first_dense)]) first_dense++;
  for (int64_t l = first_dense; l < a.layers; l++)
    if (!a.is_moe[static_cast<size_t>(l)]) {
      refused.push_back("a dense layer after MoE ones (DeepseekV3 has first_k_dense_replace dense layers, then MoE)");
      break;
    }
  refuse_if(a.mtp_layers > 0 && !a.is_moe.back(), "MTP layers after a dense last layer (DeepseekV3's are MoE)");
  refuse_listed(refused, "deepseek_v3");
  return a;
}

nlohmann::json deepseek_config_from_flags(const nlohmann::json& f, const HFArchitecture& a, const std::string& dtype) {
  const std::string& where = kFlagsWhere;
  int64_t first_dense = 0;
  while (first_dense < a.layers && !a.is_moe[static_cast<size_t>(first_dense)]) first_dense++;
  const bool yarn = get<std::string>(f, "rope-type", "", where) != "rope";
  const int64_t groups =
      get<int64_t>(f, "moe-router-group-topk", 0, where) > 0 ? get<int64_t>(f, "moe-router-num-groups", 0, where) : 1;
  const double scale = get<double>(f, "moe-router-topk-scaling-factor", 0.0, where);
  nlohmann::json rope = nullptr;
  if (yarn)
    rope = {{"type", "yarn"},
            {"factor", get<double>(f, "rotary-scaling-factor", 1.0, where)},
            {"original_max_position_embeddings", get<int64_t>(f, "yarn-original-max-position-embeddings", 4096, where)},
            {"beta_fast", get<double>(f, "yarn-beta-fast", 32.0, where)},
            {"beta_slow", get<double>(f, "yarn-beta-slow", 1.0, where)},
            {"mscale", get<double>(f, "mscale", 1.0, where)},
            {"mscale_all_dim", get<double>(f, "mscale-all-dim", 0.0, where)}};
  nlohmann::json c = shared_hf_config(f, a, dtype);
  c.update({{"architectures", {"DeepseekV3ForCausalLM"}},
            {"model_type", "deepseek_v3"},
            {"intermediate_size", a.ffn},
            {"moe_intermediate_size", a.moe_ffn},
            {"num_nextn_predict_layers", a.mtp_layers},
            {"n_shared_experts", a.shared_ffn / a.moe_ffn},
            {"n_routed_experts", a.experts},
            {"routed_scaling_factor", scale > 0 ? scale : 1.0},
            {"kv_lora_rank", a.kv_lora},
            {"q_lora_rank", a.q_lora > 0 ? nlohmann::json(a.q_lora) : nlohmann::json(nullptr)},
            {"qk_rope_head_dim", a.qk_rope},
            {"v_head_dim", a.v_dim},
            {"qk_nope_head_dim", a.qk_nope},
            {"topk_method", "noaux_tc"},
            {"scoring_func", "sigmoid"},
            {"n_group", groups},
            {"topk_group", groups > 1 ? get<int64_t>(f, "moe-router-group-topk", 1, where) : 1},
            {"moe_layer_freq", 1},
            {"first_k_dense_replace", first_dense},
            {"norm_topk_prob", true},
            {"rope_scaling", rope},
            {"rope_interleave", true},
            {"attention_bias", false}});
  return c;
}

std::vector<NativeTensor> deepseek_native_tensors(const HFArchitecture& a) {
  const int64_t H = a.hidden, V = a.vocab, E = a.experts, N = a.heads;
  std::vector<NativeTensor> out;
  auto whole = [&](const std::string& name, const Shape& s, const std::string& hf) { add_whole(out, name, s, hf); };
  auto layer = [&](const std::string& n, const std::string& h, bool moe) {
    const std::string sa = n + "self_attention.", ha = h + "self_attn.";
    whole(n + "input_layernorm.weight", {H}, h + "input_layernorm.weight");
    if (a.q_lora > 0) {
      whole(sa + "linear_q_down_proj.weight", {a.q_lora, H}, ha + "q_a_proj.weight");
      whole(sa + "q_layernorm.weight", {a.q_lora}, ha + "q_a_layernorm.weight");
      whole(sa + "linear_q_up_proj.weight", {N * (a.qk_nope + a.qk_rope), a.q_lora}, ha + "q_b_proj.weight");
    } else {
      whole(sa + "linear_q_proj.weight", {N * (a.qk_nope + a.qk_rope), H}, ha + "q_proj.weight");
    }
    whole(sa + "linear_kv_down_proj.weight", {a.kv_lora + a.qk_rope, H}, ha + "kv_a_proj_with_mqa.weight");
    whole(sa + "kv_layernorm.weight", {a.kv_lora}, ha + "kv_a_layernorm.weight");
    whole(sa + "linear_kv_up_proj.weight", {N * (a.qk_nope + a.v_dim), a.kv_lora}, ha + "kv_b_proj.weight");
    whole(sa + "linear_proj.weight", {H, N * a.v_dim}, ha + "o_proj.weight");
    whole(n + "pre_mlp_layernorm.weight", {H}, h + "post_attention_layernorm.weight");
    if (!moe) {
      add_swiglu_mlp(out, n + "mlp.", h + "mlp.", a.ffn, H);
      return;
    }
    whole(n + "mlp.router.weight", {E, H}, h + "mlp.gate.weight");
    out.push_back({n + "mlp.router.expert_bias",
                   {E},
                   {{h + "mlp.gate.e_score_correction_bias", {E}, whole_box({E}), false, /*keep_f32=*/true}}});
    add_experts(out, n + "mlp.experts.", h + "mlp.", E, a.moe_ffn, H, "gate_proj.weight", "up_proj.weight",
                "down_proj.weight");
    if (a.shared_ffn > 0) add_swiglu_mlp(out, n + "mlp.shared_experts.", h + "mlp.shared_experts.", a.shared_ffn, H);
  };
  whole("embedding.word_embeddings.weight", {V, H}, "model.embed_tokens.weight");
  for (int64_t l = 0; l < a.layers; l++)
    layer(fmt::format("decoder.layers.{}.", l), fmt::format("model.layers.{}.", l), a.is_moe[static_cast<size_t>(l)]);
  std::vector<HFPiece> embedding_copies, head_copies;  // DeepSeek's MTP layers store both again
  for (int64_t k = 0; k < a.mtp_layers; k++) {
    const std::string n = fmt::format("mtp.layers.{}.", k), h = fmt::format("model.layers.{}.", a.layers + k);
    whole(n + "enorm.weight", {H}, h + "enorm.weight");
    whole(n + "hnorm.weight", {H}, h + "hnorm.weight");
    whole(n + "eh_proj.weight", {H, 2 * H}, h + "eh_proj.weight");
    layer(n + "mtp_model_layer.", h, a.is_moe.back());
    whole(n + "final_layernorm.weight", {H}, h + "shared_head.norm.weight");
    embedding_copies.push_back({h + "embed_tokens.weight", {V, H}, whole_box({V, H}), /*duplicate=*/true});
    head_copies.push_back({h + "shared_head.head.weight", {V, H}, whole_box({V, H}), /*duplicate=*/true});
  }
  for (auto& p : embedding_copies) out.front().pieces.push_back(p);
  whole("decoder.final_layernorm.weight", {H}, "model.norm.weight");
  if (!a.tied) whole("output_layer.weight", {V, H}, "lm_head.weight");
  for (auto& p : head_copies) (a.tied ? out.front() : out.back()).pieces.push_back(p);
  return out;
}

}  // namespace moecore::ckpt::hf
