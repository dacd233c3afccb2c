// Named timers with levels (see timers.h).
#include "moecore/core/timers.h"

#include "moecore/core/error.h"
#include "moecore/core/timer.h"

namespace moecore {

namespace {
Timers* g_current = nullptr;  // the run's timers (one run at a time on a process)
TimerObserver* g_observer = nullptr;
}  // namespace

Timers::Timers(int log_level) : level_(log_level) {
  MOE_ASSERT(log_level >= 0 && log_level <= kMaxLevel);
}

void Timers::start(const std::string& name, int level) {
  if (!enabled(level)) return;
  auto [it, created] = timers_.try_emplace(name);
  Timer& t = it->second;
  if (created) t.level = level;
  MOE_ASSERT_MSG(t.level == level, "timer {} started at level {}, created at level {}", name, level, t.level);
  if (t.depth++ == 0) t.started = now_seconds();
  if (g_observer) g_observer->started(name);
}

void Timers::stop(const std::string& name) {
  auto it = timers_.find(name);
  if (it == timers_.end()) return;  // started while disabled
  Timer& t = it->second;
  MOE_ASSERT_MSG(t.depth > 0, "timer {} stopped without a start", name);
  if (--t.depth == 0) t.elapsed += now_seconds() - t.started;
  if (g_observer) g_observer->stopped(name);
}

double Timers::elapsed(const std::string& name, bool reset) {
  auto it = timers_.find(name);
  if (it == timers_.end()) return 0.0;
  Timer& t = it->second;
  double s = t.elapsed;
  if (t.depth > 0) {
    const double now = now_seconds();
    s += now - t.started;
    if (reset) t.started = now;
  }
  if (reset) t.elapsed = 0;
  return s;
}

void Timers::set_elapsed(const std::string& name, int level, double seconds) {
  if (!enabled(level)) return;
  Timer& t = timers_[name];
  t.level = level;
  t.elapsed = seconds;
}

std::vector<std::string> Timers::names() const {
  std::vector<std::string> n;
  for (const auto& [k, t] : timers_) n.push_back(k);
  return n;
}

Timers* Timers::current() {
  return g_current;
}

TimerObserver* Timers::set_observer(TimerObserver* o) {
  TimerObserver* previous = g_observer;
  g_observer = o;
  return previous;
}

Timers::Install::Install(Timers* t) : previous_(g_current) {
  g_current = t;
}

Timers::Install::~Install() {
  g_current = previous_;
}

}  // namespace moecore
