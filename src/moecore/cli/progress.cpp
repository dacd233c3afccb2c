// Progress display (see progress.h).
#include "moecore/cli/progress.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "moecore/core/timer.h"
#include "moecore/train/metrics.h"

namespace moecore::cli {

std::string format_duration(double s) {
  return train::format_duration(s);  // one format for training's progress line and the commands' bars
}

Progress::Progress(std::string label, int64_t total, std::string unit, double unit_scale)
    : label_(std::move(label)),
      unit_(std::move(unit)),
      total_(total),
      scale_(unit_scale),
      tty_(::isatty(fileno(stderr)) != 0),
      start_(now_seconds()),
      last_(start_) {}

void Progress::update(int64_t done, const std::string& extra) {
  const double now = now_seconds();
  const double since_last = now - last_;
  if (since_last < (tty_ ? 0.1 : 10.0) && done < total_) return;
  last_ = now;
  const double el = now - start_;
  const double frac = total_ > 0 ? std::min(1.0, static_cast<double>(done) / static_cast<double>(total_)) : 0.0;
  const double rate = el > 0 ? static_cast<double>(done) / scale_ / el : 0.0;
  const double eta = frac > 0 ? el * (1 - frac) / frac : 0.0;
  if (tty_) {
    const int width = 30, fill = static_cast<int>(frac * width);
    fmt::print(stderr, "\r{} [{}{}] {:5.1f}% {:.2f} {} ETA {} {}", label_, std::string(static_cast<size_t>(fill), '#'),
               std::string(static_cast<size_t>(width - fill), '.'), 100 * frac, rate, unit_, format_duration(eta),
               extra);
  } else {
    fmt::print(stderr, "{}: {:.1f}% {:.2f} {} elapsed {} ETA {} {}\n", label_, 100 * frac, rate, unit_,
               format_duration(el), format_duration(eta), extra);
  }
  std::fflush(stderr);
}

void Progress::finish(const std::string& summary) {
  if (tty_) fmt::print(stderr, "\r\033[K");
  fmt::print(stderr, "{}: {}\n", label_, summary);
}

}  // namespace moecore::cli
