// Megatron's named timers (megatron/core/timers.py) on this process: each has a log level (0, 1, 2); a timer
// whose level is above --timing-log-level reads no clock and keeps nothing. Modules time their work with a
// TimerScope; the trainer installs one Timers per run and logs it (train/timers.h: the reduction over ranks, the
// lists Megatron logs per level, the log text, the JSONL record, TensorBoard). Not a profiler: no per-kernel
// accounting, no call stacks.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace moecore {

// Sees every start and stop of an enabled timer: how the GPU's event timeline (cuda/gpu_profile.h) learns the
// phases that modules mark with a TimerScope. None is installed unless a benchmark asks (bench train --device cuda),
// so the timers behave exactly as without it.
class TimerObserver {
 public:
  virtual ~TimerObserver() = default;
  virtual void started(const std::string& name) = 0;
  virtual void stopped(const std::string& name) = 0;
};

class Timers {
 public:
  static constexpr int kMaxLevel = 2;
  explicit Timers(int log_level);
  int log_level() const { return level_; }
  bool enabled(int level) const { return level <= level_; }

  // Starts or stops `name` at `level` (a no-op above the log level). Starts nest: a timer started again before its
  // stop (a recomputed forward inside a backward) counts the outermost span once. One name, one level (asserted).
  void start(const std::string& name, int level);
  void stop(const std::string& name);
  // Seconds accumulated by `name` since the last reset (0 for a timer never started); a running timer counts up to
  // now. `reset`: starts the count again (a running timer keeps running).
  double elapsed(const std::string& name, bool reset = false);
  // Sets a timer's accumulated seconds (Megatron's set_elapsed), e.g. a span measured before the Timers existed.
  void set_elapsed(const std::string& name, int level, double seconds);
  bool has(const std::string& name) const { return timers_.count(name) > 0; }
  // The timers created so far, by name.
  std::vector<std::string> names() const;

  // The Timers of the run in progress on this process (null outside a run): what TimerScope reports to.
  static Timers* current();
  // The process's timer observer (null: none); set_observer returns the previous one.
  static TimerObserver* set_observer(TimerObserver* o);
  // Makes `t` current for its lifetime (the previous one back after).
  class Install {
   public:
    explicit Install(Timers* t);
    ~Install();
    Install(const Install&) = delete;
    Install& operator=(const Install&) = delete;

   private:
    Timers* previous_;
  };

 private:
  struct Timer {
    int level = 0, depth = 0;
    double elapsed = 0, started = 0;
  };
  int level_;
  std::map<std::string, Timer> timers_;
};

// Times the enclosing scope under `name` at `level` on the current Timers; without a run, or with the level above
// the run's --timing-log-level, it reads no clock.
class TimerScope {
 public:
  TimerScope(const char* name, int level) : name_(name) {
    Timers* t = Timers::current();
    if (t && t->enabled(level)) {
      timers_ = t;
      t->start(name, level);
    }
  }
  ~TimerScope() {
    if (timers_) timers_->stop(name_);
  }
  TimerScope(const TimerScope&) = delete;
  TimerScope& operator=(const TimerScope&) = delete;

 private:
  const char* name_;
  Timers* timers_ = nullptr;
};

}  // namespace moecore
