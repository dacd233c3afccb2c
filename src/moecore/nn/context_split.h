// Context parallelism's split of a sequence (Megatron's load balancing for causal attention): a sequence of S
// positions is cut into 2C chunks of Sc = S/(2C); context-parallel rank r holds chunks r and 2C−1−r, so its L = S/C
// local rows are chunk r's Sc rows followed by chunk 2C−1−r's. Everything keyed by position (RoPE, learned position
// embeddings, dropout masks) asks SeqSplit for the global position of a local row.
#pragma once

#include <cstdint>

#include "moecore/core/tensor.h"

namespace moecore::nn {

struct SeqSplit {
  int64_t size = 1, rank = 0;  // C and r
  bool on() const { return size > 1; }
  // Global position of local row i of a local sequence of L rows (S = L·C).
  int64_t position(int64_t i, int64_t L) const {
    if (size == 1) return i;
    const int64_t sc = L / 2;
    return i < sc ? rank * sc + i : (2 * size - 1 - rank) * sc + (i - sc);
  }
  // Calls fn(local_row, global_position, n) for each run of local rows [r0, r0 + n) whose global positions are
  // consecutive (at most two runs: a run never crosses the middle of the local sequence).
  template <typename F>
  void runs(int64_t r0, int64_t n, int64_t L, F&& fn) const {
    const int64_t mid = size == 1 ? L : L / 2;
    if (r0 < mid && r0 + n > mid) {
      fn(r0, position(r0, L), mid - r0);
      fn(mid, position(mid, L), r0 + n - mid);
    } else if (n > 0) {
      fn(r0, position(r0, L), n);
    }
  }
};

// [B, S] (tokens, labels or a loss mask) -> this rank's [B, S/C] columns (chunk r then chunk 2C−1−r); the tensor
// itself when off or undefined.
Tensor split_sequence_BS(const Tensor& x_BS, const SeqSplit& s);
// The rows of a per-position table [P, ...] (P ≥ S) at the global positions of this rank's L local rows -> [L, ...].
Tensor rows_at_positions(const Tensor& table, int64_t L, const SeqSplit& s);

}  // namespace moecore::nn
