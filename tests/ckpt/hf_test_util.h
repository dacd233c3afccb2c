// Helpers of the HuggingFace interop tests (test_hf.cpp, test_hf_deepseek.cpp).
#pragma once

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "config_util.h"
#include "moecore/ckpt/hf.h"
#include "moecore/ckpt/safetensors.h"
#include "moecore/core/rng.h"

namespace moecore::testing {

// A run over the HF test models' 96-token vocabulary, with `extra` flags.
inline train::TrainConfig hf_run_config(const std::vector<std::string>& extra) {
  return small_config(mock_run_flags(16, 2, 2, 96, 2, "1e-3"), extra);
}

// A small moecore MoE model's flags as a checkpoint stores them (2 layers, H 32, 4 SwiGLU experts), for the export
// refusals.
inline nlohmann::json small_moe_flags() {
  return {{"num-layers", 2},          {"hidden-size", 32},           {"num-attention-heads", 4},
          {"swiglu", true},           {"disable-bias-linear", true}, {"num-experts", 4},
          {"moe-ffn-hidden-size", 16}};
}

// max |a − b| / max |b| over [S][V] logits.
inline double max_rel(const std::vector<std::vector<double>>& a, const std::vector<std::vector<double>>& b) {
  double diff = 0, mx = 0;
  EXPECT_EQ(a.size(), b.size());
  for (size_t s = 0; s < a.size() && s < b.size(); s++)
    for (size_t v = 0; v < a[s].size() && v < b[s].size(); v++) {
      diff = std::max(diff, std::fabs(a[s][v] - b[s][v]));
      mx = std::max(mx, std::fabs(b[s][v]));
    }
  return diff / mx;
}

// Every tensor of HF directory `a` is in `b` with the same dtype, shape and bytes, and nothing else is.
inline void expect_same_tensors(const std::string& a, const std::string& b) {
  auto tensors = [](const std::string& dir) {
    std::map<std::string, Tensor> m;
    for (const auto& e : std::filesystem::directory_iterator(dir))
      if (e.path().extension() == ".safetensors") {
        ckpt::SafetensorsFile f(e.path().string());
        for (const auto& [name, _] : f.entries()) m[name] = f.read(name);
      }
    return m;
  };
  const auto ta = tensors(a), tb = tensors(b);
  ASSERT_EQ(ta.size(), tb.size());
  for (const auto& [name, x] : ta) {
    ASSERT_TRUE(tb.count(name)) << name;
    const Tensor& y = tb.at(name);
    ASSERT_EQ(x.dtype(), y.dtype()) << name;
    ASSERT_EQ(x.shape(), y.shape()) << name;
    ASSERT_EQ(std::memcmp(x.raw(), y.raw(), x.nbytes()), 0) << name;
  }
}

// A small Qwen3-MoE in HF config.json form (3 layers, the first dense; 4 experts top-2; 96-token vocabulary).
inline nlohmann::json qwen3_config() {
  return {{"architectures", {"Qwen3MoeForCausalLM"}},
          {"model_type", "qwen3_moe"},
          {"hidden_size", 32},
          {"num_hidden_layers", 3},
          {"num_attention_heads", 4},
          {"num_key_value_heads", 2},
          {"head_dim", 16},
          {"intermediate_size", 48},
          {"moe_intermediate_size", 16},
          {"num_experts", 4},
          {"num_experts_per_tok", 2},
          {"norm_topk_prob", true},
          {"decoder_sparse_step", 1},
          {"mlp_only_layers", {0}},
          {"vocab_size", 96},
          {"tie_word_embeddings", false},
          {"rope_theta", 10000.0},
          {"rms_norm_eps", 1e-6},
          {"max_position_embeddings", 64},
          {"hidden_act", "silu"},
          {"attention_bias", false},
          {"use_sliding_window", false},
          {"rope_scaling", nullptr},
          {"torch_dtype", "bfloat16"}};
}

// A small Mixtral in HF config.json form (2 layers, 4 experts top-2, tied embeddings).
inline nlohmann::json mixtral_config() {
  return {{"architectures", {"MixtralForCausalLM"}},
          {"model_type", "mixtral"},
          {"hidden_size", 32},
          {"num_hidden_layers", 2},
          {"num_attention_heads", 4},
          {"num_key_value_heads", 2},
          {"intermediate_size", 24},
          {"num_local_experts", 4},
          {"num_experts_per_tok", 2},
          {"vocab_size", 96},
          {"tie_word_embeddings", true},
          {"rope_theta", 1e6},
          {"rms_norm_eps", 1e-5},
          {"max_position_embeddings", 64},
          {"hidden_act", "silu"},
          {"sliding_window", nullptr},
          {"router_jitter_noise", 0.0},
          {"torch_dtype", "bfloat16"}};
}

// Writes an HF directory: every tensor of the architecture drawn from N(0, 0.2²) (norm weights 1 + N(0, 0.1²)),
// stored as bf16 across two shards with model.safetensors.index.json.
// `nan_in`: an HF tensor name whose element 3 is written as NaN (a damaged download).
inline void write_hf(const std::string& dir, const nlohmann::json& config, const std::string& nan_in = "") {
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/config.json") << config.dump(2) << "\n";
  const auto arch = ckpt::hf_architecture(config, "test");
  std::vector<ckpt::NamedTensor> shard[2];
  nlohmann::json map = nlohmann::json::object();
  uint64_t stream = 0;
  for (const auto& t : ckpt::native_tensors(arch))
    for (const auto& p : t.pieces) {
      Tensor x = Tensor::empty(p.hf_shape, DType::F32);
      const Philox rng(17, stream++);
      const bool norm = p.hf_name.find("norm") != std::string::npos;
      for (int64_t i = 0; i < x.numel(); i++)
        x.set_item(
            i, norm ? 1.0 + 0.1 * rng.normal(static_cast<uint64_t>(i)) : 0.2 * rng.normal(static_cast<uint64_t>(i)));
      if (p.hf_name == nan_in) x.set_item(3, std::numeric_limits<double>::quiet_NaN());
      const int s = p.hf_name.find("layers.0.") != std::string::npos || p.hf_name.find("embed") != std::string::npos;
      shard[s].push_back({p.hf_name, x.to(DType::BF16)});
      map[p.hf_name] = fmt::format("model-0000{}-of-00002.safetensors", s + 1);
    }
  for (int s = 0; s < 2; s++)
    ckpt::write_safetensors(fmt::format("{}/model-0000{}-of-00002.safetensors", dir, s + 1), shard[s]);
  std::ofstream(dir + "/model.safetensors.index.json") << nlohmann::json{{"weight_map", map}}.dump();
}

}  // namespace moecore::testing
