// Test helpers for training configurations: the flags of the small models the training, checkpoint and layout
// tests share, a short mock-data run, and one call from flags to a resolved TrainConfig (later flags override).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "moecore/train/config.h"
#include "moecore/train/start_config.h"

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

}  // namespace moecore::testing
