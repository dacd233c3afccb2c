// HuggingFace interop for Qwen3-MoE (Qwen3MoeForCausalLM), Mixtral (MixtralForCausalLM) and DeepSeek-V3
// (DeepseekV3ForCausalLM, which Kimi-K2's checkpoints use too): config.json to moecore's flags and back, and the
// exact map between HF tensor names and moecore's global tensors — every HF tensor is a box of one native global
// view (an expert's gate_proj is box [e, 0, :, :] of the grouped fc1 [E, 2, F, H], its up_proj box [e, 1, :, :]),
// so reading and writing are the same box copies both ways. HF safetensors directories are read sharded
// (model.safetensors.index.json) or single-file, written sharded; DeepSeek's FP8 weights (F8_E4M3 with a
// weight_scale_inv per 128×128 block) are dequantized on read. Not a general HF model loader: other architectures,
// sliding windows, other RoPE scalings and biases are refused by name.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "moecore/ckpt/checkpoint.h"
#include "moecore/ckpt/safetensors.h"

namespace moecore::ckpt {

// The shape facts the name map needs.
struct HFArchitecture {
  std::string kind;  // "qwen3_moe", "mixtral" or "deepseek_v3"
  int64_t layers = 0, hidden = 0, heads = 0, kv_heads = 0, head_dim = 0, ffn = 0, moe_ffn = 0, experts = 0;
  int64_t vocab = 0;
  bool tied = false, qk_norm = false;
  std::vector<bool> is_moe;  // per layer
  // DeepSeek-V3: Multi-Latent Attention (q_lora 0: a direct q_proj), shared experts (n_shared_experts ×
  // moe_intermediate_size), the expert bias (e_score_correction_bias), and num_nextn_predict_layers MTP modules,
  // stored as HF layers layers .. layers+mtp_layers−1 (MoE like the last decoder layer).
  int64_t q_lora = 0, kv_lora = 0, qk_nope = 0, qk_rope = 0, v_dim = 0, shared_ffn = 0, mtp_layers = 0;
  bool expert_bias = false;
};

// One HF tensor: its name and the box of the native global view it fills.
struct HFPiece {
  std::string hf_name;
  Shape hf_shape;
  Box box;
  // A second copy of the tensor's whole value (DeepSeek's MTP layer stores the shared embedding and output head
  // again): checked equal to the first piece on read, written with the same values.
  bool duplicate = false;
  bool keep_f32 = false;  // stored in f32 whatever the export dtype (HF keeps the expert bias in fp32)
};
// One native global tensor (whole, in its global view) and the HF tensors that tile it.
struct NativeTensor {
  std::string name;
  Shape global;
  std::vector<HFPiece> pieces;
};
std::vector<NativeTensor> native_tensors(const HFArchitecture& a);

// From an HF config.json: the architecture (unsupported features refused, naming the key) and the equivalent
// moecore train flags (flag name -> value; architecture only, training hyperparameters are the user's).
HFArchitecture hf_architecture(const nlohmann::json& config, const std::string& where);
nlohmann::json hf_train_flags(const nlohmann::json& config, const std::string& where);
// From moecore train flags (a checkpoint's config): the architecture of `kind` ("qwen3_moe", "mixtral",
// "deepseek_v3", or "" to choose: MLA means DeepSeek-V3, qk-norm Qwen3-MoE), refusing what the HF class cannot
// express; and its config.json.
HFArchitecture architecture_from_flags(const nlohmann::json& flags, int64_t vocab, std::string kind);
nlohmann::json hf_config_from_flags(const nlohmann::json& flags, const HFArchitecture& a, const std::string& dtype);

// An HF model directory opened for reading.
class HFModel {
 public:
  explicit HFModel(const std::string& dir);
  const std::string& dir() const { return dir_; }
  const nlohmann::json& config() const { return config_; }
  const HFArchitecture& architecture() const { return arch_; }
  // The part of native tensor `t` in box db of its global view, into dst (f32, db's volume), from the HF pieces that
  // intersect db (an expert-parallel rank reads its experts); duplicates checked where they are. Names the file and
  // tensor when one is missing or mis-shaped. FP8 pieces are dequantized with their weight_scale_inv.
  void read_into(const NativeTensor& t, Tensor& dst, const Box& db);
  // One HF piece as f32, dequantized.
  Tensor read_piece(const HFPiece& p);

 private:
  std::string dir_;
  nlohmann::json config_;
  HFArchitecture arch_;
  std::map<std::string, std::string> file_of_;  // HF tensor -> file
  std::map<std::string, std::unique_ptr<SafetensorsFile>> files_;
  int64_t fp8_block_[2] = {128, 128};  // quantization_config.weight_block_size
};

// `moecore convert hf-to-native`: a native checkpoint directory (root with a "release" marker, no optimizer
// state) holding the HF weights exactly (bf16 widened to f32), the moecore flags, the original config.json and
// the tokenizer files. Streamed: each native tensor is stored in chunks along its first dimension (experts,
// vocabulary rows) of at most about `shard_bytes` (f32), in shard files of about that size, so memory holds one
// shard, not the model (a 671B model is 2.7 TB as f32). Returns the number of native tensors written.
int64_t convert_hf_to_native(const std::string& hf_dir, const std::string& out_root,
                             int64_t shard_bytes = int64_t{4} << 30);
// `moecore convert native-to-hf`: safetensors shards of at most max_shard_bytes with
// model.safetensors.index.json, config.json (the original one when the checkpoint came from HF) and the
// tokenizer. dtype "bf16" or "f32"; empty: the original config's torch_dtype, else bf16.
int64_t convert_native_to_hf(const std::string& native, const std::string& out_dir, const std::string& kind,
                             std::string dtype, int64_t max_shard_bytes);

}  // namespace moecore::ckpt
