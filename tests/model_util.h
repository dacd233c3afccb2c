// Small model configurations for tests, one designated-initializer line each instead of a field-by-field builder
// in every test file. Only the shape; tests set the rest (activation, tying, norms) on the result.
#pragma once

#include <cstdint>

#include "moecore/moe/moe_layer.h"
#include "moecore/nn/gpt_model.h"

namespace moecore::testing {

struct GptShape {
  int64_t layers = 2, hidden = 8, ffn = 12, heads = 2, kv_heads = 2, head_dim = 4, vocab = 13, max_seq = 8;
  double init_std = 0.5;
};

inline nn::GPTConfig small_gpt(const GptShape& s) {
  nn::GPTConfig c;
  c.num_layers = s.layers;
  c.hidden_size = s.hidden;
  c.ffn_hidden_size = s.ffn;
  c.num_attention_heads = s.heads;
  c.num_query_groups = s.kv_heads;
  c.kv_channels = s.head_dim;
  c.vocab_size = s.vocab;
  c.max_seq_len = s.max_seq;
  c.init_method_std = s.init_std;
  return c;
}

// Megatron's test_sequential_mlp MoE layer: H 12, 2 experts, top-1 with pre-softmax, SwiGLU's FFN 48.
inline moe::MoELayerConfig sequential_mlp_moe() {
  moe::MoELayerConfig c;
  c.router.hidden = 12;
  c.router.num_experts = 2;
  c.router.topk = 1;
  c.router.pre_softmax = true;
  c.ffn_hidden = 48;
  return c;
}

// The small MoE layer of the fp64 finite-difference checks: H inputs, E experts, top-K, an f64 router with wide
// initial logits, FFN 6.
inline moe::MoELayerConfig fd_moe_layer(int64_t H, int64_t E, int64_t K) {
  moe::MoELayerConfig c;
  c.router.hidden = H;
  c.router.num_experts = E;
  c.router.topk = K;
  c.router.router_dtype = DType::F64;
  c.router.init_std = 0.5;
  c.ffn_hidden = 6;
  c.init_std = 0.4;
  c.output_init_std = 0.3;
  return c;
}

}  // namespace moecore::testing
