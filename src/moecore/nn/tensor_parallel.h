// Tensor parallelism with sequence parallelism (Megatron's TP + SP): between blocks, activations are split along
// the sequence, [S/TP, B, H] per rank (S-major, so a rank's shard is a contiguous slice); a block all-gathers the
// sequence, runs column-parallel then row-parallel linears on its share of heads or FFN columns, and
// reduce-scatters the partial outputs back to sequence shards. The two collectives are each other's adjoint.
#pragma once

#include "moecore/comm/process_group.h"
#include "moecore/core/tensor.h"

namespace moecore::nn {

// The tensor-parallel group of a module (null or one rank: no tensor parallelism).
struct TPContext {
  const comm::ProcessGroup* group = nullptr;
  int64_t size() const { return group ? group->size() : 1; }
  int64_t rank() const { return group ? group->rank() : 0; }
  bool on() const { return size() > 1; }
};

// [S/TP, ...] sequence shards -> [S, ...] (all-gather over the leading dimension); identity without TP.
Tensor sp_all_gather(const Tensor& x, const TPContext& tp);
// [S, ...] partial sums -> this rank's [S/TP, ...] of their sum (reduce-scatter); identity without TP.
Tensor sp_reduce_scatter(const Tensor& x, const TPContext& tp);

}  // namespace moecore::nn
