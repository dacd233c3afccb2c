// The seam through which fine-grained activation offloading (train/activation_offload.h, Megatron's
// --fine-grained-activation-offloading) sees the layers' stashes: after a layer's forward its chosen tensors go to
// host memory; before its backward they are back, and the next layer's have started coming back (the prefetch).
// The full-recompute driver (layer_recompute.h) calls it; a layer in a recompute chunk keeps nothing to offload.
// Not the copies themselves, nor which tensors (train/).
#pragma once

#include "moecore/nn/transformer_layer.h"

namespace moecore::nn {

class StashOffload {
 public:
  virtual ~StashOffload() = default;
  // After a layer's training forward (not a replay): the chosen tensors of `st` start their copy to host memory;
  // their device memory is released once the copy is done (the compute stream ordered after it).
  virtual void offload(TransformerLayer::Stash& st) = 0;
  // Before the backward of the layer of `st`: its tensors are back in the stash (the compute stream waits for their
  // copy), and those of `next` (the layer whose backward follows, null if none) start coming back.
  virtual void reload(TransformerLayer::Stash& st, TransformerLayer::Stash* next) = 0;
};

}  // namespace moecore::nn
