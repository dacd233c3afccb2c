// What one layer's stash has in host memory under fine-grained activation offloading (stash_offload.h): kept in the
// stash itself (TransformerLayer::Stash::offloaded), so that micro-batches in flight under pipelining each carry
// their own. Filled and emptied by the offloader alone (train/activation_offload.h).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "moecore/core/tensor.h"

namespace moecore::nn {

struct OffloadedStash {
  struct Entry {
    size_t slot = 0;  // the tensor's place among the stash's offloadable tensors (the offloader's order)
    Shape shape;
    DType dtype = DType::F32;
    std::shared_ptr<void> host;  // its bytes in host memory (back to the offloader's pool when released)
    int64_t alias_of = -1;       // >= 0: the same bytes as that entry (one copy, one tensor viewed twice)
  };
  std::vector<Entry> entries;
  std::vector<Tensor> reloaded;  // the device tensors a copy back is filling (one per entry, aliases shared)
  int64_t ticket = -1;           // the copy back in flight (-1: none started)
  uint64_t serial = 0;           // which forward filled it (told apart from a later stash at the same address)
  bool empty() const { return entries.empty(); }
};

}  // namespace moecore::nn
