// Routing statistics (see routing_stats.h).
#include "moecore/moe/routing_stats.h"

#include <algorithm>

namespace moecore::moe {

void RoutingStats::reset(int64_t num_experts) {
  tokens_per_expert.assign(static_cast<size_t>(num_experts), 0);
  assignments = dropped = tokens = micro_batches = 0;
  entropy_sum = z_loss_sum = 0;
  std::fill(loss_sums.begin(), loss_sums.end(), 0.0);
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

}  // namespace moecore::moe
