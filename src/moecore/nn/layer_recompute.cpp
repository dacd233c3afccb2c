// Full-layer recompute (see layer_recompute.h), and the offloading hooks around each layer (stash_offload.h).
#include "moecore/nn/layer_recompute.h"

namespace moecore::nn {

namespace {
// The recompute chunk of layer i in the block [begin, end), in indices of the whole layer list.
RecomputeConfig::Chunk chunk_in_block(const RecomputeConfig& cfg, size_t begin, size_t end, size_t i) {
  RecomputeConfig::Chunk c = cfg.chunk(static_cast<int64_t>(i - begin), static_cast<int64_t>(end - begin));
  if (c.on()) {
    c.begin += static_cast<int64_t>(begin);
    c.end += static_cast<int64_t>(begin);
  }
  return c;
}
}  // namespace

Tensor LayerRecompute::forward(Layers& layers, std::vector<TransformerLayer::Stash>& stashes, size_t begin, size_t end,
                               size_t i, const Tensor& x) const {
  const auto li = static_cast<int64_t>(i);
  const RecomputeConfig::Chunk c = chunk_in_block(cfg_, begin, end, i);
  TransformerLayer::Stash& st = stashes[i];
  Tensor y = layers[i]->forward(x, st);
  if (!c.on()) {
    if (offload_ && st.dropout.training) offload_->offload(st);
    return y;
  }
  layers[i]->release(st);
  if (li == c.begin) st.chunk_input = x;
  return y;
}

void LayerRecompute::replay(Layers& layers, std::vector<TransformerLayer::Stash>& stashes, size_t begin, size_t end,
                            size_t i, const Around& around) const {
  const RecomputeConfig::Chunk c = chunk_in_block(cfg_, begin, end, i);
  if (!c.on() || static_cast<int64_t>(i) != c.end - 1) return;
  const auto b = static_cast<size_t>(c.begin);
  Tensor h = stashes[b].chunk_input;
  stashes[b].chunk_input = Tensor();
  for (auto j = b; j < static_cast<size_t>(c.end); j++) {
    if (around) around(j, true);
    stashes[j].replay = true;
    h = layers[j]->forward(h, stashes[j]);
    stashes[j].replay = false;
    if (around) around(j, false);
  }
}

Tensor LayerRecompute::backward(Layers& layers, std::vector<TransformerLayer::Stash>& stashes, size_t begin, size_t,
                                size_t i, const Tensor& dy) const {
  if (offload_) offload_->reload(stashes[i], i > begin ? &stashes[i - 1] : nullptr);
  return layers[i]->backward(dy, stashes[i]);
}

}  // namespace moecore::nn
