// Tiny HuggingFace DeepseekV3ForCausalLM directories with known weights, for the interop tests
// (tests/ckpt/test_hf_deepseek.cpp) and the layouts that import them (tests/mpi/test_hf_layouts.cpp).
#pragma once

#include <fmt/format.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "moecore/ckpt/checkpoint.h"
#include "moecore/ckpt/hf.h"
#include "moecore/ckpt/safetensors.h"
#include "moecore/core/rng.h"

namespace moecore::testing {

inline nlohmann::json deepseek_config() {
  return {{"architectures", {"DeepseekV3ForCausalLM"}},
          {"model_type", "deepseek_v3"},
          {"vocab_size", 96},
          {"hidden_size", 32},
          {"intermediate_size", 40},
          {"moe_intermediate_size", 8},
          {"num_hidden_layers", 3},
          {"num_nextn_predict_layers", 1},
          {"num_attention_heads", 4},
          {"num_key_value_heads", 4},
          {"n_shared_experts", 1},
          {"n_routed_experts", 16},
          {"routed_scaling_factor", 2.5},
          {"kv_lora_rank", 10},
          {"q_lora_rank", 12},
          {"qk_rope_head_dim", 8},
          {"v_head_dim", 6},
          {"qk_nope_head_dim", 6},
          {"topk_method", "noaux_tc"},
          {"scoring_func", "sigmoid"},
          {"n_group", 4},
          {"topk_group", 2},
          {"num_experts_per_tok", 4},
          {"moe_layer_freq", 1},
          {"first_k_dense_replace", 1},
          {"norm_topk_prob", true},
          {"hidden_act", "silu"},
          {"max_position_embeddings", 64},
          {"rms_norm_eps", 1e-6},
          {"tie_word_embeddings", false},
          {"rope_theta", 10000.0},
          // Betas off the defaults, where they move the ramp over the 4 frequencies (channels 2..4 instead of
          // 1..3), so that --yarn-beta-fast/--yarn-beta-slow must carry them.
          {"rope_scaling",
           {{"type", "yarn"},
            {"factor", 8.0},
            {"original_max_position_embeddings", 4096},
            {"beta_fast", 4.0},
            {"beta_slow", 0.25},
            {"mscale", 0.9},
            {"mscale_all_dim", 0.6}}},
          {"rope_interleave", true},
          {"attention_bias", false},
          {"attention_dropout", 0.0},
          {"torch_dtype", "bfloat16"}};
}

// Kimi-K2: the same class, no group-limited routing (n_group 1), no MTP module, betas 1/1 (its published values:
// the ramp over channels 2..3 where the defaults give 1..3).
inline nlohmann::json kimi_config() {
  nlohmann::json c = deepseek_config();
  c["model_type"] = "kimi_k2";
  c["n_group"] = 1, c["topk_group"] = 1, c["num_nextn_predict_layers"] = 0, c["routed_scaling_factor"] = 2.827;
  c["rope_theta"] = 50000.0;
  c["rope_scaling"] = {{"type", "yarn"},       {"factor", 32.0},   {"original_max_position_embeddings", 4096},
                       {"beta_fast", 1.0},     {"beta_slow", 1.0}, {"mscale", 1.0},
                       {"mscale_all_dim", 1.0}};
  return c;
}

inline bool quantized(const std::string& hf_name) {  // DeepSeek's FP8 checkpoints: the linear layers' weights
  return hf_name.size() > 12 && hf_name.compare(hf_name.size() - 12, 12, "_proj.weight") == 0 &&
         hf_name.find("shared_head") == std::string::npos;
}

// A tensor as raw safetensors bytes (F8_E4M3 has no moecore dtype).
struct RawTensor {
  std::string name, dtype;
  Shape shape;
  std::string bytes;
};
inline RawTensor raw(const std::string& name, const Tensor& t) {
  return {name, ckpt::safetensors_dtype(t.dtype()), t.shape(),
          std::string(static_cast<const char*>(t.raw()), t.nbytes())};
}
inline void write_raw(const std::string& path, const std::vector<RawTensor>& ts) {
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  int64_t off = 0;
  for (const auto& t : ts) {
    std::vector<int64_t> shape;
    for (int d = 0; d < t.shape.ndim(); d++) shape.push_back(t.shape[d]);
    h[t.name] = {
        {"dtype", t.dtype}, {"shape", shape}, {"data_offsets", {off, off + static_cast<int64_t>(t.bytes.size())}}};
    off += static_cast<int64_t>(t.bytes.size());
  }
  const std::string header = h.dump();
  std::ofstream f(path, std::ios::binary);
  const uint64_t n = header.size();
  f.write(reinterpret_cast<const char*>(&n), 8);
  f << header;
  for (const auto& t : ts) f << t.bytes;
}

// Writes an HF directory of `config`: weights N(0, 0.2²), norms 1 + N(0, 0.1²), the expert bias N(0, 0.05²) in f32,
// everything else bf16, over two shards with an index. With `fp8_block` > 0 the linear weights are float8 e4m3
// with a power-of-two weight_scale_inv per fp8_block² block (quantization_config says so); their values are the same
// either way (fp8 × 2^−k is exact in bf16), so the bf16 and FP8 directories hold the same model.
inline void write_deepseek(const std::string& dir, nlohmann::json config, int64_t fp8_block = 0) {
  std::filesystem::create_directories(dir);
  if (fp8_block > 0)
    config["quantization_config"] = {{"quant_method", "fp8"},
                                     {"fmt", "e4m3"},
                                     {"activation_scheme", "dynamic"},
                                     {"weight_block_size", {fp8_block, fp8_block}}};
  std::ofstream(dir + "/config.json") << config.dump(2) << "\n";
  const ckpt::HFArchitecture arch = ckpt::hf_architecture(config, "test");
  std::vector<RawTensor> shard[2];
  nlohmann::json map = nlohmann::json::object();
  uint64_t stream = 0;
  auto place = [&](const std::string& name, RawTensor t) {
    const int s = name.find("layers.0.") != std::string::npos || name.find("embed") != std::string::npos;
    map[name] = fmt::format("model-0000{}-of-00002.safetensors", s + 1);
    shard[s].push_back(std::move(t));
  };
  for (const auto& t : ckpt::native_tensors(arch)) {
    Tensor whole = Tensor::empty(t.global, DType::F32);
    const Philox rng(23, stream++);
    const bool norm = t.name.find("norm") != std::string::npos, bias = t.name.find("expert_bias") != std::string::npos;
    for (int64_t i = 0; i < whole.numel(); i++) {
      const double z = rng.normal(static_cast<uint64_t>(i));
      whole.set_item(i, norm ? 1.0 + 0.1 * z : bias ? 0.05 * z : 0.2 * z);
    }
    for (const auto& p : t.pieces) {
      Tensor x = Tensor::empty(p.hf_shape, DType::F32);
      ckpt::copy_intersection(whole, ckpt::whole_box(t.global), x, p.box);
      if (p.keep_f32) {
        place(p.hf_name, raw(p.hf_name, x));
        continue;
      }
      if (!quantized(p.hf_name)) {
        place(p.hf_name, raw(p.hf_name, x.to(DType::BF16)));
        continue;
      }
      // e4m3 bytes with exponents 4..8 (|v| in [1/8, 2)), times a block scale 2^−3..2^−5.
      const int64_t M = x.dim(0), N = x.dim(1), B = fp8_block > 0 ? fp8_block : 16;
      const int64_t SM = (M + B - 1) / B, SN = (N + B - 1) / B;
      const Philox q(29, stream++);
      std::string bytes(static_cast<size_t>(M * N), '\0');
      Tensor scale = Tensor::empty({SM, SN}, DType::F32);
      for (int64_t b = 0; b < SM * SN; b++) scale.data<float>()[b] = std::ldexp(1.0f, -3 - static_cast<int>(b % 3));
      for (int64_t i = 0; i < M * N; i++) {
        const uint32_t r = q.block(static_cast<uint64_t>(i))[0];
        const uint8_t byte = static_cast<uint8_t>((r & 0x80) | ((4 + (r >> 8) % 5) << 3) | ((r >> 16) & 7));
        bytes[static_cast<size_t>(i)] = static_cast<char>(byte);
        x.data<float>()[i] = ckpt::f8_e4m3_to_f32(byte) * scale.data<float>()[(i / N / B) * SN + (i % N) / B];
      }
      if (fp8_block > 0) {
        place(p.hf_name, {p.hf_name, "F8_E4M3", p.hf_shape, bytes});
        place(p.hf_name + "_scale_inv", raw(p.hf_name + "_scale_inv", scale));
      } else {
        place(p.hf_name, raw(p.hf_name, x.to(DType::BF16)));
      }
    }
  }
  for (int s = 0; s < 2; s++) write_raw(fmt::format("{}/model-0000{}-of-00002.safetensors", dir, s + 1), shard[s]);
  std::ofstream(dir + "/model.safetensors.index.json") << nlohmann::json{{"weight_map", map}}.dump();
}

}  // namespace moecore::testing
