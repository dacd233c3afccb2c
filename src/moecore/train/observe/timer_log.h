// Megatron's timers over the ranks of a run (megatron/core/timers.py log and write, training.py training_log):
// which timers the log shows at each --timing-log-level, each timer's milliseconds gathered from every rank, and
// the text ("(min, max) time across ranks (ms):"), the metrics-file record and the TensorBoard values made from
// them. The timers themselves (names, levels, start/stop) are core/timers.h; this file reads them, times nothing.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "moecore/comm/process_group.h"
#include "moecore/core/timers.h"

namespace moecore::train {

// The timers the log line is followed by at `level`, in Megatron's order (training_log's timers_to_log: none at 0;
// the step phases at 1; the operations at 2, with moecore's MoE timers after Megatron's). Names no rank timed
// are left out of the output, as Megatron leaves them.
std::vector<std::string> logged_timer_names(int level);

// One timer over the ranks: milliseconds per `normalizer` on every rank (0 where a rank never ran it), and the
// min and max over the ranks that ran it (> 0, as Megatron filters).
struct TimerRow {
  std::string name;
  double min_ms = 0, max_ms = 0;
  std::vector<double> rank_ms;
};

// Collective over `world` (null or one rank: this process alone); every rank passes the same names. The named
// timers' seconds since their last reset, gathered from every rank (one all-gather); `reset`: counts start again.
// Rows only for timers some rank ran, in the order of `names`.
std::vector<TimerRow> gather_timers(Timers& timers, const std::vector<std::string>& names,
                                    const comm::ProcessGroup* world, double normalizer, bool reset = true);

// Megatron's text for --timing-log-option (minmax: "(min, max) time across ranks (ms):" then a dotted line per
// timer; max: "max time across ranks (ms):"; all: "times across ranks (ms):" with every rank's line). Empty
// when there are no rows.
std::string format_timers(const std::vector<TimerRow>& rows, const std::string& option);

// The metrics-file record of the rows: {"timers": {name: {"min_ms", "max_ms"} (+ "rank_ms": [...] with option
// "all")}, "iteration": N, "timing_log_option": option} — its own line, apart from the loss records.
nlohmann::json timers_record(const std::vector<TimerRow>& rows, const std::string& option, int64_t iteration);

}  // namespace moecore::train
