// One training run's history as `moecore report` reads it back from the metrics JSON-lines file (--metrics-file,
// written by train/metrics.cpp): the logged training rows and the validation points, by iteration. Reads files;
// draws nothing (report_page.h turns histories into the page).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace moecore::report {

struct RunHistory {
  std::string name;  // shown in legends and the run table (escaped there)
  std::string path;
  // The log-interval rows ({"iteration": ..., "lm_loss": ..., ...}) and the validation rows ({"eval": "valid",
  // "iteration": ..., "lm_loss": ...}), each ascending by iteration, one per iteration. A resumed run appends to
  // the file from its checkpoint on: a training row whose iteration is not past the last one starts that new
  // segment, and what the interrupted run logged from that iteration on is dropped.
  std::vector<nlohmann::json> train, valid;
  std::vector<nlohmann::json> alarms;  // health alarms' records ({"alarm", "iteration", "action", "message"})
  // --timing-log-level's records after the log lines ({"timers": {name: {"min_ms", "max_ms"}}, "iteration", ...}).
  std::vector<nlohmann::json> timers;
  int64_t skipped_lines = 0;  // a last line cut short by a killed run (no newline, not JSON): left out, counted
};

// Reads `path`. Every line must be a JSON object with an integer "iteration"; a bad line is an error naming the
// file and line, except a final line without its newline (a run killed while writing it), which is skipped.
RunHistory read_run_history(const std::string& path, const std::string& name);

// The name a run gets without --name: the file's stem, or its directory's name when the stem is the default
// "metrics" (runs/a/metrics.jsonl -> "a").
std::string default_run_name(const std::string& path);

}  // namespace moecore::report
