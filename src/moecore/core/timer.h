// Wall-clock time on the monotonic clock, in seconds, for step times, benchmarks and progress lines.
// Not a profiler: no per-op accounting (kernels keep their own statistics).
#pragma once

#include <chrono>

namespace moecore {

// Seconds on the monotonic clock since an arbitrary origin; only differences mean anything.
inline double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Seconds since construction or the last restart().
class Stopwatch {
 public:
  Stopwatch() : start_(now_seconds()) {}
  double seconds() const { return now_seconds() - start_; }
  void restart() { start_ = now_seconds(); }

 private:
  double start_;
};

}  // namespace moecore
