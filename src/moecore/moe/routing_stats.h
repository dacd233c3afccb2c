// Per-layer routing statistics, accumulated over the micro-batches of one step and read by the trainer for its
// log line and metrics file: tokens per expert, dropped assignments, load balance, router entropy, aux losses.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace moecore::moe {

struct RoutingStats {
  std::vector<int64_t> tokens_per_expert;  // assignments kept, per expert
  int64_t assignments = 0;                 // routed (token, expert) pairs before dropping
  int64_t dropped = 0;                     // of those, dropped by capacity
  double entropy_sum = 0;                  // Σ over tokens of the router entropy (nats)
  int64_t tokens = 0;
  int64_t micro_batches = 0;
  std::vector<std::string> loss_names;     // "load_balancing_loss", "seq_load_balancing_loss", ...
  std::vector<double> loss_sums;           // Σ over micro-batches of L / coeff (Megatron's logged value)
  double z_loss_sum = 0;

  void reset(int64_t num_experts);
  double max_load() const;    // max_e tokens_e
  double mean_load() const;   // mean_e tokens_e
  double entropy() const { return tokens ? entropy_sum / static_cast<double>(tokens) : 0.0; }
};

}  // namespace moecore::moe
