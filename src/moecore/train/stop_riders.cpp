// The run-control riders of the gradient-norm all-reduce (see stop_riders.h).
#include "moecore/train/stop_riders.h"

#include <cmath>

namespace moecore::train {

StopRiders StopRiders::of_rank(int signal, bool past_duration, bool async_written) {
  return {signal != 0 ? 1.0 : 0.0, static_cast<double>(signal), past_duration ? 1.0 : 0.0, async_written ? 1.0 : 0.0};
}

std::array<double, StopRiders::kCount> StopRiders::packed() const {
  return {ranks_stopping, signal_sum, ranks_past_duration, ranks_async_written};
}

StopRiders StopRiders::unpacked(const std::array<double, kCount>& a) {
  return {a[0], a[1], a[2], a[3]};
}

int StopRiders::stop_signal(int mine) const {
  if (mine != 0) return mine;
  return ranks_stopping > 0 ? static_cast<int>(std::lround(signal_sum / ranks_stopping)) : 0;
}

}  // namespace moecore::train
