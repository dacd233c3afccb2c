// Progress display for long work other than training (preprocess, HF conversion, checkpoint save and load): a
// redrawn bar with rate and ETA on a terminal, periodic plain lines otherwise (logs and CI), never both, on stderr.
// Quick work shows nothing: the first line comes only once the work has run for a while (kQuietSeconds), so tests
// and small models stay silent. Training's own line is train/metrics (progress_line).
#pragma once

#include <cstdint>
#include <string>

namespace moecore {

class Progress {
 public:
  // Seconds before the first line, and between plain lines (MOECORE_TEST_PROGRESS_SECONDS overrides both, for
  // tests only: 0 shows every update).
  static constexpr double kQuietSeconds = 3.0, kPlainIntervalSeconds = 10.0;
  // total: units of work (bytes, steps); unit: shown after the rate ("MB/s" divides by 1e6).
  Progress(std::string label, int64_t total, std::string unit, double unit_scale = 1.0);
  void update(int64_t done, const std::string& extra = "");
  // The summary line, always (a command's result).
  void finish(const std::string& summary);
  // The summary line only when progress was shown (work that outlasted the quiet time); nothing otherwise.
  void finish_if_shown(const std::string& summary);
  bool shown() const { return shown_; }
  // No progress from this process from now on (the ranks of a job other than rank 0).
  static void silence_this_process();

 private:
  std::string label_, unit_;
  int64_t total_;
  double scale_;
  bool tty_, shown_ = false;
  double quiet_, interval_;
  double start_, last_;  // now_seconds()
};

// m:ss, or h:mm:ss from an hour on.
std::string format_duration(double seconds);

}  // namespace moecore
