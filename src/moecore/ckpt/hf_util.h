// Helpers shared by the HuggingFace interop files (hf.cpp, hf_config.cpp, hf_deepseek.cpp, hf_names.cpp): typed
// config.json values with the key named on error, and the boxes the name maps are made of.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <type_traits>
#include <vector>

#include "moecore/ckpt/checkpoint.h"
#include "moecore/ckpt/hf.h"
#include "moecore/core/error.h"

namespace moecore::ckpt::hf {

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

inline Box box(const Shape& global, std::vector<int64_t> offset, const Shape& size) {
  return Box{global, size, offset};
}

// "model_type"/"architectures" to a kind ("qwen3_moe", "mixtral", "deepseek_v3"), or refused naming both.
std::string kind_of(const nlohmann::json& c, const std::string& where);

// Pieces of the name maps shared by the architectures: a tensor that is one HF tensor whole; the SwiGLU MLP
// (gate_proj, up_proj -> fc1 [2, F, H]; down_proj -> fc2 [H, F]) under native prefix n and HF prefix h; the grouped
// experts under h ("experts.{e}." + the three names given).
void add_whole(std::vector<NativeTensor>& out, const std::string& name, const Shape& s, const std::string& hf);
void add_swiglu_mlp(std::vector<NativeTensor>& out, const std::string& n, const std::string& h, int64_t F, int64_t H);
void add_experts(std::vector<NativeTensor>& out, const std::string& n, const std::string& h, int64_t E, int64_t F,
                 int64_t H, const char* gate, const char* up, const char* down);

// The train flags every HF MoE class shares: the layer count and widths, SwiGLU without biases, RMSNorm, full RoPE,
// the expert shapes and the layer pattern, no hidden dropout.
nlohmann::json shared_train_flags(const HFArchitecture& a);
// The config.json keys every HF MoE class shares, from the train flags: sizes, vocabulary, RoPE base (rope_scaling
// null), norm epsilon, top-k, dropout, init, dtype.
nlohmann::json shared_hf_config(const nlohmann::json& flags, const HFArchitecture& a, const std::string& dtype);
// What none of the HF MoE classes can express, appended to `refused`: a dense model, a non-SwiGLU FFN, linear biases,
// LayerNorm, positions other than RoPE, zero-centred norm weights.
void refuse_unexpressible(const nlohmann::json& flags, std::vector<std::string>& refused);

// The "[0,1,...]" moe-layer-freq of a per-layer MoE mask.
std::string layer_freq(const std::vector<bool>& is_moe);
// Refused features, listed: "the checkpoint's model cannot be written as K: it has A, B".
void refuse_listed(const std::vector<std::string>& refused, const std::string& kind);

// DeepSeek-V3 (hf_deepseek.cpp).
HFArchitecture deepseek_architecture(const nlohmann::json& c, const std::string& where);
nlohmann::json deepseek_train_flags(const nlohmann::json& c, const HFArchitecture& a, const std::string& where);
HFArchitecture deepseek_architecture_from_flags(const nlohmann::json& f, int64_t vocab);
nlohmann::json deepseek_config_from_flags(const nlohmann::json& f, const HFArchitecture& a, const std::string& dtype);
std::vector<NativeTensor> deepseek_native_tensors(const HFArchitecture& a);

}  // namespace moecore::ckpt::hf
