// What rides the step's gradient-norm all-reduce (ChainedOptimizer::finish_gradients) so that every rank takes
// the same run-control decision at the same step boundary without a collective of its own: the stop request and
// its signal, --exit-duration-in-mins passed, and this rank's background save written. Each field is summed over
// the ranks (a count of ranks, or a sum of signal numbers). Not the decisions' actions: those are the trainer's.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace moecore::train {

struct StopRiders {
  double ranks_stopping = 0;       // ranks that received a stop signal (train/signals.h)
  double signal_sum = 0;           // the sum of those ranks' signal numbers
  double ranks_past_duration = 0;  // ranks past --exit-duration-in-mins
  double ranks_async_written = 0;  // ranks whose files of the --async-save in flight are written and fsynced

  // One rank's riders: `signal` the stop signal it received (0: none).
  static StopRiders of_rank(int signal, bool past_duration, bool async_written);

  // The riders in the order they ride the all-reduce, and back.
  static constexpr size_t kCount = 4;
  std::array<double, kCount> packed() const;
  static StopRiders unpacked(const std::array<double, kCount>& a);

  // After the sum over the ranks. The signal training stops on (0: none): `mine` when this rank received one, else
  // the one the others received (their mean signal number: exact when they received the same).
  int stop_signal(int mine) const;
  bool past_duration() const { return ranks_past_duration > 0; }
  // Whether all `world` ranks have written their files of the background save.
  bool async_written_everywhere(int64_t world) const { return ranks_async_written >= static_cast<double>(world); }
};

}  // namespace moecore::train
