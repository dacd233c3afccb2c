// Wall-clock seconds from a monotonic clock, for throughput and progress: the one timer every benchmark and log
// line uses. Not a profiler.
#pragma once

#include <chrono>

namespace moecore {

inline double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace moecore
