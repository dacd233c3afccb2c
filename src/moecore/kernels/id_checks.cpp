// The deferred id checks (see id_checks.h): the GPU's record (the id-check table dispatch.cpp gives, none in a build
// without CUDA) read and raised with the CPU kernels' messages.
#include "moecore/kernels/id_checks.h"

#include "moecore/core/error.h"
#include "moecore/kernels/dispatch.h"

namespace moecore::kernels {

void set_id_check_iteration(int64_t iteration) {
  if (const IdCheckKernels* gpu = id_checks_on_gpu()) gpu->set_iteration(iteration);
}

void raise_deferred_id_checks() {
  const IdCheckKernels* gpu = id_checks_on_gpu();
  if (!gpu) return;
  const BadId b = gpu->take_bad_id();
  if (b.kind < 0) return;
  const std::string skipped = fmt::format("found on the GPU; no update from iteration {} on was applied", b.iteration);
  if (b.kind == 0)
    MOE_CHECK(false,
              "iteration {}: token id {} at position {} is outside the vocabulary [0, {}); the data was tokenized "
              "with a larger vocabulary than --vocab-size / the tokenizer in use ({})",
              b.iteration, b.id, b.position, b.vocab, skipped);
  MOE_CHECK(false, "iteration {}: label {} at position {} is outside the vocabulary [0, {}) ({})", b.iteration, b.id,
            b.position, b.vocab, skipped);
}

}  // namespace moecore::kernels
