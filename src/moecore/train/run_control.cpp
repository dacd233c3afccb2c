// Run control (see run_control.h).
#include "moecore/train/run_control.h"

#include <fmt/format.h>

#include <chrono>
#include <thread>

#include "moecore/comm/watchdog.h"
#include "moecore/core/timer.h"

namespace moecore::train {

namespace {
double g_process_start = now_seconds();  // static initialization: as close to the process start as we get
}  // namespace

void configure_collective_timeout(const TrainConfig& c) {
  if (c.testing_collective_timeout_seconds > 0)
    comm::set_collective_timeout(
        c.testing_collective_timeout_seconds,
        fmt::format("--testing-collective-timeout-seconds {}", c.testing_collective_timeout_seconds));
  else
    comm::set_collective_timeout(static_cast<double>(c.distributed_timeout_minutes) * 60.0,
                                 fmt::format("--distributed-timeout-minutes {}", c.distributed_timeout_minutes));
}

double minutes_since_process_start() {
  return (now_seconds() - g_process_start) / 60.0;
}

void set_process_start_minutes_ago(double minutes) {
  g_process_start = now_seconds() - minutes * 60.0;
}

void maybe_stall(const TrainConfig& c, int64_t world_rank, int64_t iteration_now) {
  if (c.testing_stall.empty()) return;
  const auto a = c.testing_stall.find(':'), b = c.testing_stall.rfind(':');
  const int64_t rank = to_int("testing-stall", c.testing_stall.substr(0, a));
  const int64_t it = to_int("testing-stall", c.testing_stall.substr(a + 1, b - a - 1));
  const int64_t secs = to_int("testing-stall", c.testing_stall.substr(b + 1));
  if (rank == world_rank && it == iteration_now + 1) std::this_thread::sleep_for(std::chrono::seconds(secs));
}

}  // namespace moecore::train
