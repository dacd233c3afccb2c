// Progress display (see progress.h).
#include "moecore/core/progress.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "moecore/core/timer.h"

namespace moecore {

namespace {
bool g_silenced = false;
// MOECORE_TEST_PROGRESS_SECONDS (tests only): the quiet time and the plain-line interval, or -1 when unset.
double test_seconds() {
  const char* s = std::getenv("MOECORE_TEST_PROGRESS_SECONDS");
  if (!s || !*s) return -1;
  char* end = nullptr;
  const double v = std::strtod(s, &end);
  return end && *end == '\0' && v >= 0 ? v : -1;
}
}  // namespace

std::string format_duration(double s) {
  const int64_t t = std::isfinite(s) && s > 0 ? static_cast<int64_t>(s + 0.5) : 0;
  if (t >= 3600) return fmt::format("{}:{:02}:{:02}", t / 3600, t / 60 % 60, t % 60);
  return fmt::format("{}:{:02}", t / 60, t % 60);
}

void Progress::silence_this_process() {
  g_silenced = true;
}

Progress::Progress(std::string label, int64_t total, std::string unit, double unit_scale)
    : label_(std::move(label)),
      unit_(std::move(unit)),
      total_(total),
      scale_(unit_scale),
      tty_(::isatty(fileno(stderr)) != 0),
      start_(now_seconds()),
      last_(start_) {
  const double t = test_seconds();
  quiet_ = t >= 0 ? t : kQuietSeconds;
  interval_ = t >= 0 ? t : kPlainIntervalSeconds;
}

void Progress::update(int64_t done, const std::string& extra) {
  if (g_silenced) return;
  const double now = now_seconds();
  const double el = now - start_;
  if (el < quiet_) return;  // quick work: nothing
  if (shown_ && now - last_ < (tty_ ? 0.1 : interval_) && done < total_) return;
  shown_ = true;
  last_ = now;
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
  if (g_silenced) return;
  if (tty_ && shown_) fmt::print(stderr, "\r\033[K");
  fmt::print(stderr, "{}: {}\n", label_, summary);
  std::fflush(stderr);
}

void Progress::finish_if_shown(const std::string& summary) {
  if (shown_) finish(summary);
}

}  // namespace moecore
