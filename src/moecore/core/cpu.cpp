// CPU helpers (see cpu.h).
#include "moecore/core/cpu.h"

#include <omp.h>

namespace moecore {
int num_threads() {
  return omp_get_max_threads();
}
}  // namespace moecore
