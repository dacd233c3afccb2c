// Test helpers for training configurations: the flags of the small models the training, checkpoint and layout
// tests share, a short mock-data run, and one call from flags to a resolved TrainConfig (later flags override).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "moecore/train/config/config.h"
#include "moecore/train/config/start_config.h"

namespace moecore::testing {

// `a` then `b` (no flag in common).
inline std::vector<std::string> operator+(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Not Megatron's default LayerNorm and learned positions: the RMSNorm + RoPE model the tests were written for.
inline std::vector<std::string> rmsnorm_rope_flags() {
  return {"--normalization", "RMSNorm", "--position-embedding-type", "rope"};
}

// Two layers, H 32, 4 heads, SwiGLU, 4 experts top-2 of FFN 32, RMSNorm + RoPE: the smallest MoE model worth
// training.
inline std::vector<std::string> tiny_moe_flags() {
  return std::vector<std::string>{"--num-layers",          "2", "--hidden-size",     "32",
                                  "--num-attention-heads", "4", "--swiglu",          "--disable-bias-linear",
                                  "--num-experts",         "4", "--moe-router-topk", "2",
                                  "--moe-ffn-hidden-size", "32"} +
         rmsnorm_rope_flags();
}

// Three layers H 64 with everything a layout can split: GQA, qk-norm, an untied output layer, a dense first layer
// (FFN 96), then MoE layers of 4 experts top-2 (FFN 32) with a gated shared expert, aux and z losses; RMSNorm + RoPE.
inline std::vector<std::string> layered_moe_flags() {
  return std::vector<std::string>{"--num-layers",
                                  "3",
                                  "--hidden-size",
                                  "64",
                                  "--num-attention-heads",
                                  "4",
                                  "--group-query-attention",
                                  "--num-query-groups",
                                  "2",
                                  "--qk-layernorm",
                                  "--untie-embeddings-and-output-weights",
                                  "--swiglu",
                                  "--disable-bias-linear",
                                  "--num-experts",
                                  "4",
                                  "--moe-router-topk",
                                  "2",
                                  "--moe-ffn-hidden-size",
                                  "32",
                                  "--moe-shared-expert-intermediate-size",
                                  "32",
                                  "--moe-shared-expert-gate",
                                  "--moe-layer-freq",
                                  "[0,1,1]",
                                  "--ffn-hidden-size",
                                  "96",
                                  "--moe-aux-loss-coeff",
                                  "1e-2",
                                  "--moe-z-loss-coeff",
                                  "1e-3"} +
         rmsnorm_rope_flags();
}

// Multi-latent attention small enough for tests: kv LoRA 16, head dims 8 + 8 (rope) and v 12 (the kernel's head dim
// pads v), qk-layernorm, YaRN with factor 4 and both mscales; q LoRA 24 when `q_lora`.
inline std::vector<std::string> small_mla_flags(bool q_lora) {
  std::vector<std::string> f = {"--multi-latent-attention",
                                "--kv-lora-rank",
                                "16",
                                "--qk-head-dim",
                                "8",
                                "--qk-pos-emb-head-dim",
                                "8",
                                "--v-head-dim",
                                "12",
                                "--qk-layernorm",
                                "--rotary-scaling-factor",
                                "4",
                                "--mscale",
                                "0.8",
                                "--mscale-all-dim",
                                "0.6"};
  if (q_lora) f = f + std::vector<std::string>{"--q-lora-rank", "24"};
  return f;
}

// DeepSeek-V3's routing on a 2-layer model: a dense first layer (FFN 64), sigmoid scores over 2 groups of which 1 is
// kept (each scored by its top 2, as HF's DeepseekV3), the expert bias moving at a visible rate, scaling 2.5, a shared
// expert and the sequence aux loss.
inline std::vector<std::string> deepseek_routing_flags() {
  return {"--moe-layer-freq",
          "[0,1]",
          "--ffn-hidden-size",
          "64",
          "--moe-router-score-function",
          "sigmoid",
          "--moe-router-num-groups",
          "2",
          "--moe-router-group-topk",
          "1",
          "--moe-router-enable-expert-bias",
          "--moe-router-bias-update-rate",
          "1e-2",
          "--moe-router-topk-scaling-factor",
          "2.5",
          "--moe-shared-expert-intermediate-size",
          "32",
          "--moe-router-load-balancing-type",
          "seq_aux_loss",
          "--moe-aux-loss-coeff",
          "1e-3"};
}

// `iters` steps of `global` sequences (micro-batches of `micro`) of length `seq` over mock tokens below `vocab`,
// no evaluation, no dropout (tests about something else compare exact numbers; dropout tests turn it on).
inline std::vector<std::string> mock_run_flags(int64_t seq, int64_t micro, int64_t global, int64_t vocab, int64_t iters,
                                               const std::string& lr) {
  return {"--seq-length",
          std::to_string(seq),
          "--micro-batch-size",
          std::to_string(micro),
          "--global-batch-size",
          std::to_string(global),
          "--mock-data",
          "--vocab-size",
          std::to_string(vocab),
          "--train-iters",
          std::to_string(iters),
          "--lr",
          lr,
          "--eval-iters",
          "0",
          "--hidden-dropout",
          "0",
          "--attention-dropout",
          "0"};
}

// `base` with `extra` overriding its flags, parsed and resolved as `moecore train` would.
inline train::TrainConfig small_config(const std::vector<std::string>& base,
                                       const std::vector<std::string>& extra = {}) {
  return train::parse_train_config(train::override_flags(base, extra));
}

// Four layers (dense first and last, MoE between, so pipeline stages hold different kinds), H 32, 4 experts top-2,
// aux and z losses, `iters` steps of 4 micro-batches of 2: the multi-rank layout tests' model.
inline std::vector<std::string> four_layer_moe_flags(int64_t iters) {
  return train::override_flags(tiny_moe_flags(), {"--num-layers", "4"}) +
         std::vector<std::string>{"--moe-layer-freq",
                                  "[0,1,1,0]",
                                  "--ffn-hidden-size",
                                  "48",
                                  "--moe-aux-loss-coeff",
                                  "1e-2",
                                  "--moe-z-loss-coeff",
                                  "1e-3",
                                  "--make-vocab-size-divisible-by",
                                  "64"} +
         mock_run_flags(16, 2, 8, 128, iters, "1e-3");
}

// Fine-grained activation offloading of every module Megatron names that these models have, whatever the size.
inline std::vector<std::string> offload_all_modules_flags() {
  return {"--fine-grained-activation-offloading",
          "--offload-modules",
          "attn_norm",
          "qkv_linear",
          "core_attn",
          "attn_proj",
          "mlp_norm",
          "expert_fc1",
          "moe_act",
          "--min-offloaded-tensor-size",
          "0"};
}

}  // namespace moecore::testing
