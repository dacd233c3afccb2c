// The router's sparse decision, the contract between Router and TokenDispatcher: K expert ids and probabilities per
// token, [T, K], never a dense [T, E] map. Capacity-dropped assignments are marked, and padding to capacity is a
// rule the dispatcher applies, so dropping and padding are exactly Megatron's (reference §1.2).
#pragma once

#include "moecore/core/tensor.h"

namespace moecore::moe {

struct RoutedTokens {
  Tensor idx_TK;    // I32 expert of token t's j-th choice (selection order); −1 where capacity dropped it
  Tensor probs_TK;  // router dtype: its probability (topk scaling applied); 0 where dropped
  // > 0 (--moe-pad-expert-input-to-capacity): every expert receives exactly this many rows from each source rank's
  // tokens; an expert with fewer kept rows is filled with the earliest tokens that have no row for it, at
  // probability 0 (real tokens whose output is multiplied by 0).
  int64_t pad_capacity = 0;
};

}  // namespace moecore::moe
