// Routing statistics of one global batch for an FFN that routes tokens (the MoE layer): tokens per expert,
// dropped assignments, router entropy, aux and z losses. A plain record, defined here so that nn/ and train/ can read
// it without knowing moe/; the router fills and owns it. Not a place for counters that influence training.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace moecore::nn {

struct RoutingStats {
  std::vector<int64_t> tokens_per_expert;  // assignments kept, per expert
  int64_t assignments = 0;                 // routed (token, expert) pairs before dropping
  int64_t dropped = 0;                     // of those, dropped by capacity
  double entropy_sum = 0;                  // Σ over tokens of the router entropy (nats)
  int64_t tokens = 0;
  int64_t micro_batches = 0;
  std::vector<std::string> loss_names;  // "load_balancing_loss", "seq_load_balancing_loss", ...
  std::vector<double> loss_sums;        // Σ over micro-batches of L / coeff (Megatron's logged value)
  double z_loss_sum = 0;

  // Zeroes every count and sum; sizes and names stay (no allocation).
  void reset();
  // Copies the counts and sums of `from` (same sizes), leaving the names: a snapshot without allocation.
  void copy_values(const RoutingStats& from);
  double max_load() const;   // max_e tokens_e
  double mean_load() const;  // mean_e tokens_e
  double entropy() const { return tokens ? entropy_sum / static_cast<double>(tokens) : 0.0; }
};

}  // namespace moecore::nn
