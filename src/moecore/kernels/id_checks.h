// Token ids (the embedding) and labels (the cross-entropy) outside the vocabulary. The CPU kernels check them as
// they read them and raise at once. The GPU's kernels record the first one in device memory instead of reading the
// ids back (no host synchronisation per call): raise_deferred_id_checks reads the record when the trainer logs,
// saves or evaluates, and raises the CPU's error naming the id, its position and the iteration; the optimizer's
// kernels skip every update from that iteration on (kernels/grad_clip.h), so nothing trained on the bad ids.
#pragma once

#include <cstdint>

namespace moecore::kernels {

// The iteration the following GPU calls belong to (their record names it).
void set_id_check_iteration(int64_t iteration);
// Raises the first recorded bad id or label (MOE_CHECK: a user's data error), clearing the record; nothing where
// none was recorded or no GPU was used. One read-back on a GPU that recorded checks.
void raise_deferred_id_checks();

// The first recorded bad id of the current device (kind 0 before 1), its record cleared; none recorded: kind -1.
struct BadId {
  int kind;  // 0: a token id, 1: a label
  int64_t position, id, vocab, iteration;
};
// The GPU's record of bad ids (kernels/cuda/multi_tensor_ops.cpp; the CPU's kernels raise at once and keep none),
// which kernels/dispatch.cpp gives where the build has a GPU.
struct IdCheckKernels {
  void (*set_iteration)(int64_t iteration);
  BadId (*take_bad_id)();
};

}  // namespace moecore::kernels
