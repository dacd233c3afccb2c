// Routing statistics (see routing_stats.h).
#include "moecore/nn/routing_stats.h"

#include <algorithm>

#include "moecore/core/error.h"

namespace moecore::nn {

void RoutingStats::reset() {
  std::fill(tokens_per_expert.begin(), tokens_per_expert.end(), int64_t{0});
  assignments = dropped = tokens = micro_batches = 0;
  entropy_sum = z_loss_sum = 0;
  std::fill(loss_sums.begin(), loss_sums.end(), 0.0);
}

void RoutingStats::copy_values(const RoutingStats& from) {
  MOE_ASSERT(tokens_per_expert.size() == from.tokens_per_expert.size() && loss_sums.size() == from.loss_sums.size());
  std::copy(from.tokens_per_expert.begin(), from.tokens_per_expert.end(), tokens_per_expert.begin());
  std::copy(from.loss_sums.begin(), from.loss_sums.end(), loss_sums.begin());
  assignments = from.assignments;
  dropped = from.dropped;
  entropy_sum = from.entropy_sum;
  tokens = from.tokens;
  micro_batches = from.micro_batches;
  z_loss_sum = from.z_loss_sum;
}

double RoutingStats::max_load() const {
  int64_t m = 0;
  for (int64_t c : tokens_per_expert) m = std::max(m, c);
  return static_cast<double>(m);
}

double RoutingStats::mean_load() const {
  if (tokens_per_expert.empty()) return 0;
  double s = 0;
  for (int64_t c : tokens_per_expert) s += static_cast<double>(c);
  return s / static_cast<double>(tokens_per_expert.size());
}

}  // namespace moecore::nn
