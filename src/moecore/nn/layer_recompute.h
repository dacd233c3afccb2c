// Full-layer recompute over a model's layers (Megatron's --recompute-granularity full with --recompute-method
// uniform or block, megatron/core/recompute.py): in a chunk of layers, forward keeps only the chunk's input (in
// its first layer's stash) and each layer's replay state; before the backward of the chunk's last layer, replay
// re-runs the chunk's forwards into the stashes, then each layer's backward runs as without recompute. Everything a
// layer does in forward happens again in the replay, tensor- and expert-parallel communication included (as in
// Megatron).
#pragma once

#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "moecore/nn/recompute.h"
#include "moecore/nn/stash_offload.h"
#include "moecore/nn/transformer_layer.h"

namespace moecore::nn {

class LayerRecompute {
 public:
  explicit LayerRecompute(const RecomputeConfig& cfg = {}) : cfg_(cfg) {}
  using Layers = std::vector<std::unique_ptr<TransformerLayer>>;
  // Layer i's forward (backward) with stashes[i], for the stashes of every layer. The recompute chunks are counted
  // within the block of layers [begin, end) that holds i: a pipeline stage's model chunk (Megatron's
  // TransformerBlock), so a recompute chunk never spans two model chunks.
  Tensor forward(Layers& layers, std::vector<TransformerLayer::Stash>& stashes, size_t begin, size_t end, size_t i,
                 const Tensor& x) const;
  Tensor backward(Layers& layers, std::vector<TransformerLayer::Stash>& stashes, size_t begin, size_t end, size_t i,
                  const Tensor& dy) const;
  // Called before i's backward: where i is the last layer of its full-recompute chunk, the chunk's forwards again,
  // from its input, with around(j, true) before and around(j, false) after layer j's (Megatron FSDP gathers a unit
  // there and releases it after, but for i's, which the backward reads next); elsewhere nothing.
  using Around = std::function<void(size_t j, bool before)>;
  void replay(Layers& layers, std::vector<TransformerLayer::Stash>& stashes, size_t begin, size_t end, size_t i,
              const Around& around = {}) const;
  const RecomputeConfig& config() const { return cfg_; }
  // Fine-grained activation offloading of the layers outside recompute chunks (null: none); it must outlive us.
  void set_offload(StashOffload* o) { offload_ = o; }

 private:
  RecomputeConfig cfg_;
  StashOffload* offload_ = nullptr;
};

}  // namespace moecore::nn
