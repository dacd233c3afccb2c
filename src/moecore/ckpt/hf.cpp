// HuggingFace interop (see hf.h).
#include "moecore/ckpt/hf.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <type_traits>

#include "moecore/ckpt/manager.h"
#include "moecore/ckpt/metadata.h"
#include "moecore/core/error.h"
#include "moecore/core/file.h"
#include "moecore/core/progress.h"
#include "moecore/moe/moe_layer.h"

namespace moecore::ckpt {

namespace fs = std::filesystem;

namespace {

nlohmann::json read_json(const std::string& path) {
  try {
    return nlohmann::json::parse(moecore::read_file(path, "JSON file"));
  } catch (const nlohmann::json::exception& e) {
    MOE_CHECK(false, "{} is not valid JSON ({})", path, e.what());
  }
  return {};
}

Box box(const Shape& global, std::vector<int64_t> offset, const Shape& size) {
  return Box{global, size, offset};
}

// A value of the HF config with a default; wrong types are named.
template <typename T>
T get(const nlohmann::json& c, const char* key, T fallback, const std::string& where) {
  if (!c.contains(key) || c[key].is_null()) return fallback;
  // An integer field must hold an integer: get<int64_t>() casts a float, undefined beyond int64's range (found by
  // fuzz_hf_config: "moe_intermediate_size": 3.3e124).
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>)
    MOE_CHECK(c[key].is_number_integer(), "{}: '{}' must be an integer, got {}", where, key, c[key].dump());
  try {
    return c[key].get<T>();
  } catch (const nlohmann::json::exception&) {
    MOE_CHECK(false, "{}: '{}' has an unexpected value {}", where, key, c[key].dump());
  }
  return fallback;
}
template <typename T>
T need(const nlohmann::json& c, const char* key, const std::string& where) {
  MOE_CHECK(c.contains(key) && !c[key].is_null(), "{}: '{}' is missing", where, key);
  return get<T>(c, key, T{}, where);
}

std::string kind_of(const nlohmann::json& c, const std::string& where) {
  const std::string mt = get<std::string>(c, "model_type", "", where);
  std::string arch;
  if (c.contains("architectures") && c["architectures"].is_array() && !c["architectures"].empty())
    arch = c["architectures"][0].is_string() ? c["architectures"][0].get<std::string>() : "";
  if (mt == "qwen3_moe" || arch == "Qwen3MoeForCausalLM") return "qwen3_moe";
  if (mt == "mixtral" || arch == "MixtralForCausalLM") return "mixtral";
  MOE_CHECK(false,
            "{}: model_type '{}' ({}) is not supported; moecore converts Qwen3MoeForCausalLM and MixtralForCausalLM",
            where, mt, arch.empty() ? "no architectures" : arch);
  return "";
}

}  // namespace

HFArchitecture hf_architecture(const nlohmann::json& c, const std::string& where) {
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
  std::string freq = "[";
  for (size_t i = 0; i < a.is_moe.size(); i++) freq += fmt::format("{}{}", i ? "," : "", a.is_moe[i] ? 1 : 0);
  freq += "]";
  nlohmann::json f = {{"num-layers", a.layers},
                      {"hidden-size", a.hidden},
                      {"num-attention-heads", a.heads},
                      {"group-query-attention", a.kv_heads != a.heads},
                      {"num-query-groups", a.kv_heads},
                      {"kv-channels", a.head_dim},
                      {"qk-layernorm", a.qk_norm},
                      {"untie-embeddings-and-output-weights", !a.tied},
                      {"swiglu", true},
                      {"squared-relu", false},
                      {"disable-bias-linear", true},
                      {"num-experts", a.experts},
                      {"ffn-hidden-size", a.ffn},
                      {"moe-ffn-hidden-size", a.moe_ffn},
                      {"moe-router-topk", need<int64_t>(c, "num_experts_per_tok", where)},
                      {"moe-router-score-function", "softmax"},
                      {"moe-layer-freq", freq},
                      {"rotary-base", get<double>(c, "rope_theta", a.kind == "mixtral" ? 1e6 : 1e4, where)},
                      {"rotary-percent", 1.0},
                      {"normalization", "RMSNorm"},  // Qwen3-MoE and Mixtral: not Megatron's defaults
                      {"position-embedding-type", "rope"},
                      {"norm-epsilon", get<double>(c, "rms_norm_eps", a.kind == "mixtral" ? 1e-5 : 1e-6, where)},
                      // HF Qwen3-MoE and Mixtral drop only attention probabilities (attention_dropout, 0.0 in
                      // their released configs); they have no hidden dropout.
                      {"attention-dropout", get<double>(c, "attention_dropout", 0.0, where)},
                      {"hidden-dropout", 0.0}};
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
  refuse_if(a.experts == 0, "a dense model (no --num-experts)");
  refuse_if(!b("swiglu"), "a non-SwiGLU FFN");
  refuse_if(!b("disable-bias-linear"), "linear biases");
  refuse_if(get<int64_t>(f, "moe-shared-expert-intermediate-size", 0, where) > 0, "shared experts");
  refuse_if(get<std::string>(f, "moe-router-score-function", "softmax", where) != "softmax", "sigmoid routing");
  refuse_if(b("moe-router-enable-expert-bias"), "expert bias");
  refuse_if(get<double>(f, "moe-router-topk-scaling-factor", 0.0, where) != 0.0, "a top-k scaling factor");
  refuse_if(get<int64_t>(f, "moe-router-num-groups", 0, where) > 0, "group-limited routing");
  refuse_if(get<double>(f, "rotary-percent", 1.0, where) != 1.0, "partial RoPE");
  refuse_if(get<bool>(f, "multi-latent-attention", false, where),
            "multi-latent attention (the HF export covers Qwen3-MoE and Mixtral; a DeepSeek-V3 model stays in "
            "moecore's checkpoint format)");
  // Checkpoints from before these flags existed hold RMSNorm and rope models.
  refuse_if(get<std::string>(f, "normalization", "RMSNorm", where) != "RMSNorm",
            "LayerNorm (the HF classes use RMSNorm: train with --normalization RMSNorm)");
  refuse_if(get<std::string>(f, "position-embedding-type", "rope", where) != "rope",
            "--position-embedding-type " + get<std::string>(f, "position-embedding-type", "rope", where) +
                " (the HF classes use RoPE: train with --position-embedding-type rope)");
  refuse_if(get<bool>(f, "apply-layernorm-1p", false, where), "zero-centred norm weights (--apply-layernorm-1p)");
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
    MOE_CHECK(false, "--arch {} is not supported; use qwen3-moe or mixtral", kind);
  }
  if (!refused.empty()) {
    std::string list;
    for (const auto& r : refused) list += (list.empty() ? "" : ", ") + r;
    MOE_CHECK(false, "the checkpoint's model cannot be written as {}: it has {}", kind, list);
  }
  return a;
}

nlohmann::json hf_config_from_flags(const nlohmann::json& f, const HFArchitecture& a, const std::string& dtype) {
  const std::string where = "the checkpoint's configuration";
  nlohmann::json c = {{"hidden_size", a.hidden},
                      {"num_hidden_layers", a.layers},
                      {"num_attention_heads", a.heads},
                      {"num_key_value_heads", a.kv_heads},
                      {"head_dim", a.head_dim},
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

std::vector<NativeTensor> native_tensors(const HFArchitecture& a) {
  const int64_t H = a.hidden, D = a.head_dim, V = a.vocab, E = a.experts;
  std::vector<NativeTensor> out;
  auto whole = [&](const std::string& name, const Shape& s, const std::string& hf) {
    out.push_back({name, s, {{hf, s, whole_box(s)}}});
  };
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
      const int64_t F = a.ffn;
      out.push_back({n + "mlp.linear_fc1.weight",
                     {2, F, H},
                     {{h + "mlp.gate_proj.weight", {F, H}, box({2, F, H}, {0, 0, 0}, {1, F, H})},
                      {h + "mlp.up_proj.weight", {F, H}, box({2, F, H}, {1, 0, 0}, {1, F, H})}}});
      whole(n + "mlp.linear_fc2.weight", {H, F}, h + "mlp.down_proj.weight");
      continue;
    }
    const int64_t F = a.moe_ffn;
    const bool mix = a.kind == "mixtral";
    const std::string moe = h + (mix ? "block_sparse_moe." : "mlp.");
    whole(n + "mlp.router.weight", {E, H}, moe + "gate.weight");
    NativeTensor fc1{n + "mlp.experts.linear_fc1.weight", {E, 2, F, H}, {}};
    NativeTensor fc2{n + "mlp.experts.linear_fc2.weight", {E, H, F}, {}};
    for (int64_t e = 0; e < E; e++) {
      const std::string x = fmt::format("{}experts.{}.", moe, e);
      fc1.pieces.push_back(
          {x + (mix ? "w1.weight" : "gate_proj.weight"), {F, H}, box(fc1.global, {e, 0, 0, 0}, {1, 1, F, H})});
      fc1.pieces.push_back(
          {x + (mix ? "w3.weight" : "up_proj.weight"), {F, H}, box(fc1.global, {e, 1, 0, 0}, {1, 1, F, H})});
      fc2.pieces.push_back(
          {x + (mix ? "w2.weight" : "down_proj.weight"), {H, F}, box(fc2.global, {e, 0, 0}, {1, H, F})});
    }
    out.push_back(fc1);
    out.push_back(fc2);
  }
  whole("decoder.final_layernorm.weight", {H}, "model.norm.weight");
  if (!a.tied) whole("output_layer.weight", {V, H}, "lm_head.weight");
  return out;
}

HFModel::HFModel(const std::string& dir) : dir_(dir) {
  const std::string cpath = dir + "/config.json";
  MOE_CHECK(fs::exists(cpath), "{} has no config.json: not a HuggingFace model directory", dir);
  config_ = read_json(cpath);
  arch_ = hf_architecture(config_, cpath);
  const std::string ipath = dir + "/model.safetensors.index.json";
  if (fs::exists(ipath)) {
    const nlohmann::json idx = read_json(ipath);
    MOE_CHECK(idx.contains("weight_map") && idx["weight_map"].is_object(), "{} has no weight_map", ipath);
    for (const auto& [name, file] : idx["weight_map"].items()) {
      MOE_CHECK(file.is_string() && file.get<std::string>().find('/') == std::string::npos,
                "{}: '{}' maps to an invalid file {}", ipath, name, file.dump());
      file_of_[name] = file.get<std::string>();
    }
  } else {
    MOE_CHECK(fs::exists(dir + "/model.safetensors"),
              "{} has neither model.safetensors.index.json nor model.safetensors", dir);
    auto f = std::make_unique<SafetensorsFile>(dir + "/model.safetensors");
    for (const auto& [name, e] : f->entries()) file_of_[name] = "model.safetensors";
    files_["model.safetensors"] = std::move(f);
  }
  // Every tensor must be one the map places: anything else (biases, another architecture's extras) would be
  // silently dropped.
  std::set<std::string> known;
  for (const auto& t : native_tensors(arch_))
    for (const auto& p : t.pieces) known.insert(p.hf_name);
  std::string unknown;
  int n = 0;
  for (const auto& [name, file] : file_of_) {
    const bool ignorable =
        name.find("rotary_emb.inv_freq") != std::string::npos || (arch_.tied && name == "lm_head.weight");
    if (known.count(name) || ignorable) continue;
    if (n++ < 8) unknown += "\n  " + name + " (" + file + ")";
  }
  MOE_CHECK(n == 0, "{} holds {} tensor(s) the {} mapping does not know, which would be dropped:{}{}", dir, n,
            arch_.kind, unknown, n > 8 ? "\n  ..." : "");
}

Tensor HFModel::read(const NativeTensor& t) {
  Tensor whole = Tensor::zeros(t.global, DType::F32);
  const Box wb = whole_box(t.global);
  for (const auto& p : t.pieces) {
    const auto it = file_of_.find(p.hf_name);
    MOE_CHECK(it != file_of_.end(), "{}: tensor {} is missing", dir_, p.hf_name);
    auto& f = files_[it->second];
    if (!f) f = std::make_unique<SafetensorsFile>(dir_ + "/" + it->second);
    MOE_CHECK(f->contains(p.hf_name), "{}: the index places {} in {}, which does not hold it", dir_, p.hf_name,
              it->second);
    Tensor x = f->read(p.hf_name);
    MOE_CHECK(x.shape() == p.hf_shape, "{}: {} in {} has shape {}, expected {} for this config.json", dir_, p.hf_name,
              it->second, x.shape().str(), p.hf_shape.str());
    MOE_CHECK(x.dtype() == DType::BF16 || x.dtype() == DType::F32, "{}: {} is {}; bf16 and f32 are supported", dir_,
              p.hf_name, dtype_name(x.dtype()));
    if (x.dtype() != DType::F32) x = x.to(DType::F32);
    copy_intersection(x, p.box, whole, wb);
  }
  return whole;
}

int64_t convert_hf_to_native(const std::string& hf_dir, const std::string& out_root) {
  HFModel m(hf_dir);
  std::vector<StoredTensor> all;
  const std::vector<NativeTensor> tensors = native_tensors(m.architecture());
  int64_t bytes = 0, done = 0;  // as fp32
  for (const auto& t : tensors) bytes += t.global.numel() * 4;
  Progress bar("HF import", bytes, "MB/s", 1e6);  // shown only when reading takes a while
  for (const auto& t : tensors) {
    all.push_back({t.name, whole_box(t.global), m.read(t)});
    done += t.global.numel() * 4;
    bar.update(done, fmt::format("{} of {} tensors", all.size(), tensors.size()));
  }
  bar.finish_if_shown(
      fmt::format("read {} tensors ({:.1f} MB as fp32) from {}", all.size(), static_cast<double>(bytes) / 1e6, hf_dir));
  nlohmann::json state = {{"format", kTrainStateFormat},
                          {"release", true},
                          {"iteration", 0},
                          {"consumed_samples", 0},
                          {"optimizer", false},
                          {"vocab", {{"size", m.architecture().vocab}, {"padded", m.architecture().vocab}}},
                          {"hf", {{"architecture", m.architecture().kind}, {"source", fs::absolute(hf_dir).string()}}},
                          {"config", hf_train_flags(m.config(), hf_dir + "/config.json")}};
  // The original config.json travels verbatim (native-to-hf writes it back); the tokenizer too.
  std::vector<std::pair<std::string, std::string>> extra{
      {"hf_config.json", moecore::read_file(hf_dir + "/config.json", "HF config")}};
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
    if (fs::exists(hf_dir + "/" + f)) extra.push_back({f, moecore::read_file(hf_dir + "/" + f, "HF tokenizer file")});
  save_checkpoint(out_root, -1, all, state, nullptr, extra);
  return static_cast<int64_t>(all.size());
}

int64_t convert_native_to_hf(const std::string& native, const std::string& out_dir, const std::string& kind_flag,
                             std::string dtype, int64_t max_shard_bytes) {
  const auto found = find_checkpoint(native);
  MOE_CHECK(found, "--input {} holds no moecore checkpoint", native);
  const nlohmann::json& st = found->state;
  MOE_CHECK(st.contains("config") && st.contains("vocab"), "{}/{} lacks config or vocab", found->dir, kStateFile);
  const int64_t vocab = st["vocab"].value("padded", int64_t{0});
  const std::string hfc = found->dir + "/hf_config.json";
  std::string config_text, kind = kind_flag;
  if (fs::exists(hfc)) {  // converted from HF: its config.json, exactly
    config_text = moecore::read_file(hfc, "HF config");
    const nlohmann::json c = nlohmann::json::parse(config_text);
    const std::string k = kind_of(c, hfc);
    MOE_CHECK(kind.empty() || kind == k, "--arch {}: the checkpoint came from a {} model", kind, k);
    kind = k;
    if (dtype.empty()) dtype = c.value("torch_dtype", "bfloat16") == "float32" ? "f32" : "bf16";
  }
  if (dtype.empty()) dtype = "bf16";
  MOE_CHECK(dtype == "bf16" || dtype == "f32", "--dtype {}: use bf16 or f32", dtype);
  const HFArchitecture a = architecture_from_flags(st["config"], vocab, kind);
  if (config_text.empty()) config_text = hf_config_from_flags(st["config"], a, dtype).dump(2) + "\n";
  fs::create_directories(out_dir);
  const DType dt = dtype == "f32" ? DType::F32 : DType::BF16;
  std::vector<NamedTensor> shard;
  int64_t shard_bytes = 0, total = 0, count = 0;
  std::vector<std::vector<std::string>> shard_names;
  auto flush = [&] {
    if (shard.empty()) return;
    write_safetensors(fmt::format("{}/part-{:05d}.tmp", out_dir, shard_names.size()), shard, {{"format", "pt"}});
    std::vector<std::string> names;
    for (const auto& t : shard) names.push_back(t.name);
    shard_names.push_back(names);
    shard.clear();
    shard_bytes = 0;
  };
  const std::vector<ShardRecord> records = read_model_index(found->dir);
  const std::vector<NativeTensor> tensors = native_tensors(a);
  int64_t bytes = 0, done = 0;  // as fp32
  for (const auto& t : tensors) bytes += t.global.numel() * 4;
  Progress bar("HF export", bytes, "MB/s", 1e6);  // shown only when the export takes a while
  for (const auto& t : tensors) {
    bar.update(done, fmt::format("{} of {} tensors", &t - tensors.data(), tensors.size()));
    done += t.global.numel() * 4;
    Tensor whole = Tensor::empty(t.global, DType::F32);
    load_tensors(found->dir, records, {LoadTarget{t.name, whole_box(t.global), &whole}});
    for (const auto& p : t.pieces) {
      Tensor x = Tensor::empty(p.hf_shape, DType::F32);
      copy_intersection(whole, whole_box(t.global), x, p.box);
      if (dt != DType::F32) x = x.to(dt);
      if (shard_bytes > 0 && shard_bytes + static_cast<int64_t>(x.nbytes()) > max_shard_bytes) flush();
      shard_bytes += static_cast<int64_t>(x.nbytes());
      total += static_cast<int64_t>(x.nbytes());
      shard.push_back({p.hf_name, x});
      count++;
    }
  }
  flush();
  bar.finish_if_shown(
      fmt::format("wrote {} tensors ({:.1f} MB) to {}", count, static_cast<double>(total) / 1e6, out_dir));
  nlohmann::json map = nlohmann::json::object();
  const size_t n = shard_names.size();
  for (size_t i = 0; i < n; i++) {
    const std::string name = fmt::format("model-{:05d}-of-{:05d}.safetensors", i + 1, n);
    rename_checked(fmt::format("{}/part-{:05d}.tmp", out_dir, i), out_dir + "/" + name);
    for (const auto& t : shard_names[i]) map[t] = name;
  }
  // Files an earlier export may hold are replaced atomically: a failure leaves them as they were.
  write_file_atomic(out_dir + "/model.safetensors.index.json",
                    nlohmann::json{{"metadata", {{"total_size", total}}}, {"weight_map", map}}.dump(2) + "\n");
  write_file_atomic(out_dir + "/config.json", config_text);
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
    if (fs::exists(found->dir + "/" + f))
      write_file_atomic(out_dir + "/" + f, moecore::read_file(found->dir + "/" + f, "tokenizer file"));
  return count;
}

}  // namespace moecore::ckpt
