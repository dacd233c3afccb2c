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

}  // namespace moecore::kernels
