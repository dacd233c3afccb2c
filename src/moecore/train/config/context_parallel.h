// Context parallelism's flags (--context-parallel-size, --cp-comm-type, --hierarchical-context-parallel-sizes):
// Megatron's argument checks and the few of its attention backend (Transformer Engine) that refuse a layout before
// any work, and the per-layer communication types the model takes. The split itself: nn/context_split.h; the
// attention: nn/context_attention.h; the groups: train/parallel_groups.h.
#pragma once

#include <string>
#include <vector>

#include "moecore/nn/context_attention.h"

namespace moecore::train {

struct TrainConfig;

// Throws a user error naming the flag, the value and what would fit.
void check_context_parallel(const TrainConfig& c);
nn::CpCommType parse_cp_comm_type(const std::string& s);
// One type per layer (Megatron: one value for every layer, or one per layer).
std::vector<nn::CpCommType> cp_comm_types(const TrainConfig& c);
// --hierarchical-context-parallel-sizes as integers (empty when not given).
std::vector<int64_t> hierarchical_cp_sizes(const TrainConfig& c);

}  // namespace moecore::train
