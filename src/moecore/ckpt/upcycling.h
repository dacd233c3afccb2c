// Upcycling a dense FFN into routed experts (Megatron's moe/upcycling_utils.py, reference §1.14): the tensor
// transformation, and one MoE layer filled from a dense checkpoint with it; the trainer decides which checkpoint and
// layers it applies to, and checks the flags.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include "moecore/core/tensor.h"
#include "moecore/nn/parameter.h"

namespace moecore::ckpt {

// The weight scale that keeps a token's routed mix of chunks equal to the dense output: act_scale = g (top-k then
// softmax) or r·g²/k (softmax before top-k, r = E/g), applied as act_scale^(1/3) to both matrices of a gated or
// squared-ReLU FFN (cubic in the scale) and act_scale^(1/2) otherwise.
double upcycling_scale(int64_t experts, int64_t granularity, int64_t topk, bool pre_softmax, bool cubic);

// Dense fc1_hFH [halves, F, H] (halves 2: gate and up of SwiGLU) and fc2_HF [H, F] -> experts' fc1
// [E, halves, F/g, H] and fc2 [E, H, F/g]: fc1 cut into g chunks along F (each half alike), fc2 along its input;
// expert e takes chunk e mod g; both scaled by `scale`.
std::pair<Tensor, Tensor> upcycle_experts(const Tensor& fc1_hFH, const Tensor& fc2_HF, int64_t experts,
                                          int64_t granularity, double scale);

// Router [E, H] rows: row e becomes row e div g, so the g chunks of one dense replica tie in score.
void tie_router_rows(Tensor& router_EH, int64_t granularity);

// The dense FFN a checkpoint stores under one layer's prefix (decoder.layers.N.mlp.): linear_fc1.weight, [2, F, H]
// when gated (SwiGLU) or [F, H], and linear_fc2.weight [H, F].
struct DenseFFN {
  int64_t ffn_hidden = 0, hidden = 0;  // F, H
  bool gated = false;
};
// One MoE layer from the dense FFN in the checkpoint `dir` under `prefix`: upcycle_experts into this rank's boxes of
// the experts' weights `fc1` ([E, 2, F/g, H] gated, else [E, F/g, H]) and `fc2` ([E, H, F/g]), and the router's rows
// tied (`router_EH`, replicated).
void upcycle_layer(const std::string& dir, const std::string& prefix, const DenseFFN& dense, int64_t granularity,
                   double scale, nn::Parameter& fc1, nn::Parameter& fc2, Tensor& router_EH);

}  // namespace moecore::ckpt
