// Progress display for long work: a redrawn bar with rate and ETA on a terminal, periodic plain lines otherwise
// (logs and CI), never both.
#pragma once

#include <cstdint>
#include <string>

namespace moecore::cli {

class Progress {
 public:
  // total: units of work (bytes, steps); unit: shown after the rate ("MB/s" divides by 1e6).
  Progress(std::string label, int64_t total, std::string unit, double unit_scale = 1.0);
  void update(int64_t done, const std::string& extra = "");
  void finish(const std::string& summary);

 private:
  std::string label_, unit_;
  int64_t total_;
  double scale_;
  bool tty_;
  double start_, last_;  // now_seconds()
};

std::string format_duration(double seconds);

}  // namespace moecore::cli
