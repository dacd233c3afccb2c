// Shared benchmark helpers (see common.h).
#include "moecore/cli/bench/common.h"

#include <algorithm>

#include "moecore/core/error.h"
#include "moecore/core/rng.h"

namespace moecore::cli {

void fill_random(Tensor& t, uint64_t stream, double std) {
  Philox rng(1234, stream);
  for (int64_t i = 0; i < t.numel(); i++) t.set_item(i, std * rng.normal(static_cast<uint64_t>(i)));
}

double median(std::vector<double> v) {
  MOE_ASSERT(!v.empty());
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace moecore::cli
