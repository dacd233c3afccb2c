// Full-layer recompute over a model's layers (Megatron's --recompute-granularity full with --recompute-method
// uniform or block, megatron/core/recompute.py): in a chunk of layers, forward keeps only the chunk's input (in
// its first layer's stash) and each layer's replay state; the backward of the chunk's last layer re-runs the
// chunk's forwards into the stashes, then each layer's backward runs as without recompute. Everything a layer does
// in forward happens again in the replay, tensor- and expert-parallel communication included (as in Megatron).
#pragma once

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
  const RecomputeConfig& config() const { return cfg_; }
  // The layers [first, last) whose forwards backward(..., i, ...) replays before i's backward: its full-recompute
  // chunk where i is the chunk's last layer, else none (first == last).
  std::pair<size_t, size_t> replayed_by(size_t begin, size_t end, size_t i) const;
  // Fine-grained activation offloading of the layers outside recompute chunks (null: none); it must outlive us.
  void set_offload(StashOffload* o) { offload_ = o; }

 private:
  RecomputeConfig cfg_;
  StashOffload* offload_ = nullptr;
};

}  // namespace moecore::nn
