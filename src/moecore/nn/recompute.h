// Activation recompute, Megatron's --recompute-granularity / --recompute-method / --recompute-num-layers /
// --recompute-modules: which layers and modules keep less in their stash and re-run their forward in backward
// (DESIGN contract 1). The driver of full-layer recompute: layer_recompute.h. Not the flag checks (train/).
//
// A re-run forward ("replay") must give bitwise the values of the first one: dropout masks and router noise are
// functions of global coordinates and of the forward's index (kept in the stash), and a replay accumulates no
// statistics, aux-loss sums, tokens-per-expert or expert-bias counts (FeedForward::Stash::recompute).
#pragma once

#include <cstdint>

namespace moecore::nn {

struct RecomputeConfig {
  enum class Method { Uniform, Block };
  // --recompute-granularity full: whole layers keep only the input of their chunk.
  bool full = false;
  Method method = Method::Uniform;  // --recompute-method
  int64_t num_layers = 0;           // --recompute-num-layers: layers per chunk (uniform), first N layers (block)
  // --recompute-granularity selective: the modules of --recompute-modules.
  bool core_attn = false;       // attention keeps q, k, v; its output and softmax statistics are recomputed
  bool moe_act = false;         // experts keep fc1's output; the activation (⊙ prob) fed to fc2 is recomputed
  bool layernorm = false;       // input and pre-MLP norms keep their input; their output is recomputed
  bool mlp = false;             // a dense MLP (not an MoE layer) keeps only its input
  bool moe = false;             // an MoE layer keeps only its input (router, dispatch and experts re-run)
  bool shared_experts = false;  // shared experts keep only their input
  bool mla_up_proj = false;     // MLA keeps its latents; the up projections, RoPE and q, k, v are recomputed

  // The full-recompute chunk of layer i among L: [begin, end); empty (begin == end) when layer i is not recomputed.
  struct Chunk {
    int64_t begin = 0, end = 0;
    bool on() const { return end > begin; }
  };
  Chunk chunk(int64_t i, int64_t L) const;
  bool any() const { return full || core_attn || moe_act || layernorm || mlp || moe || shared_experts || mla_up_proj; }
};

}  // namespace moecore::nn
