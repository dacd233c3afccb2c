// Recompute configuration (see recompute.h): Megatron's uniform and block layer selection
// (megatron/core/recompute.py): uniform cuts the layers into chunks of num_layers, each recomputed as one unit;
// block recomputes each of the first num_layers layers on its own and keeps the rest.
#include "moecore/nn/recompute.h"

#include <algorithm>

namespace moecore::nn {

RecomputeConfig::Chunk RecomputeConfig::chunk(int64_t i, int64_t L) const {
  if (!full || num_layers <= 0 || i < 0 || i >= L) return {i, i};
  if (method == Method::Block) return i < num_layers ? Chunk{i, i + 1} : Chunk{i, i};
  const int64_t begin = i / num_layers * num_layers;
  return {begin, std::min(begin + num_layers, L)};
}

}  // namespace moecore::nn
