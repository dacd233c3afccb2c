// Stop requests by signal (see signals.h).
#include "moecore/train/signals.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <ctime>
#include <thread>

namespace moecore::train {

namespace {
std::atomic<int> g_requested{0};
static_assert(std::atomic<int>::is_always_lock_free, "the handler may only touch lock-free atomics");

extern "C" void on_stop_signal(int sig) {
  int none = 0;
  if (g_requested.compare_exchange_strong(none, sig)) return;
  if (sig == SIGINT) {  // the second Ctrl-C: leave now; saves are atomic, so the last good checkpoint stays
    static const char msg[] = "\nmoecore: second SIGINT: exiting at once, without a checkpoint\n";
    ssize_t rc = ::write(STDERR_FILENO, msg, sizeof(msg) - 1);
    (void)rc;
    ::_exit(130);
  }
}

// The kill-sequence watch (signals.h): the ticker thread stamps its ticks and the resumes it notices; the SIGCONT
// handler judges at once from those stamps.
constexpr int64_t kMs = 1000000, kTick = 50 * kMs;
constexpr int64_t kStopped = kTick + 500 * kMs;  // a tick this long spanned a stop of the whole process
std::atomic<int64_t> g_tick_ns{0};               // CLOCK_MONOTONIC of the ticker's last tick (0: no watch)
std::atomic<int64_t> g_resumed_ns{0};            // of the last tick that came after a stop
static_assert(std::atomic<int64_t>::is_always_lock_free, "the handler may only touch lock-free atomics");

int64_t monotonic_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);  // async-signal-safe
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

// A SIGCONT after a stop finds either the ticker not yet run since (its last tick long past) or the resume already
// stamped; the ticker stamps the resume before the tick and this reads them in the other order, so one of the two
// shows any stop. A SIGCONT within a second of a resume counts as that resume. Anything else resumed nothing: the
// first signal of a kill sequence, so the stop starts now rather than at the SIGTERM that follows.
extern "C" void on_cont_signal(int) {
  const int64_t now = monotonic_ns(), tick = g_tick_ns.load(), resumed = g_resumed_ns.load();
  if (tick == 0 || now - tick > kStopped || now - resumed < 1000 * kMs) return;
  int none = 0;
  g_requested.compare_exchange_strong(none, StopSignals::kKillSequence);
}

// The signals --exit-signal accepts: Megatron takes any name of Python's signal.Signals; these are the ones a
// handler can catch and return from (SIGKILL and SIGSTOP cannot be caught; after SIGSEGV, SIGBUS, SIGFPE, SIGILL,
// SIGTRAP, SIGABRT or SIGSYS returning from a handler re-runs the fault, so those are refused).
const std::pair<int, const char*> kNames[] = {
    {SIGTERM, "SIGTERM"}, {SIGINT, "SIGINT"},   {SIGUSR1, "SIGUSR1"},     {SIGUSR2, "SIGUSR2"},   {SIGHUP, "SIGHUP"},
    {SIGQUIT, "SIGQUIT"}, {SIGALRM, "SIGALRM"}, {SIGVTALRM, "SIGVTALRM"}, {SIGPROF, "SIGPROF"},   {SIGXCPU, "SIGXCPU"},
    {SIGXFSZ, "SIGXFSZ"}, {SIGPIPE, "SIGPIPE"}, {SIGCHLD, "SIGCHLD"},     {SIGCONT, "SIGCONT"},   {SIGTSTP, "SIGTSTP"},
    {SIGTTIN, "SIGTTIN"}, {SIGTTOU, "SIGTTOU"}, {SIGURG, "SIGURG"},       {SIGWINCH, "SIGWINCH"}, {SIGIO, "SIGIO"},
    {SIGPWR, "SIGPWR"}};
}  // namespace

// Ticks every 50 ms, stamping each tick, and each tick that took half a second longer (the whole process was
// stopped, SIGSTOP or SIGTSTP, and has just been resumed) as a resume; on_cont_signal reads the stamps.
class KillSequenceWatch {
 public:
  KillSequenceWatch() {
    g_resumed_ns = 0;
    g_tick_ns = monotonic_ns();
    thread_ = std::thread([this] { run(); });
  }
  ~KillSequenceWatch() {
    done_ = true;
    thread_.join();
    g_tick_ns = 0;
  }

 private:
  void run() {
    int64_t last = g_tick_ns.load();
    while (!done_) {
      std::this_thread::sleep_for(std::chrono::nanoseconds(kTick));
      const int64_t now = monotonic_ns();
      if (now - last > kStopped) g_resumed_ns.store(now);  // before the tick: see on_cont_signal
      g_tick_ns.store(now);
      last = now;
    }
  }
  std::atomic<bool> done_{false};
  std::thread thread_;
};

StopSignals::StopSignals(const std::vector<int>& signals, bool kill_sequence) {
  g_requested = 0;
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // a signal never fails a read or write half-way
  for (int s : signals) {
    struct sigaction old {};
    if (::sigaction(s, &sa, &old) == 0) previous_.push_back({s, old});
  }
  if (kill_sequence) {
    sa.sa_handler = on_cont_signal;
    struct sigaction old {};
    if (::sigaction(SIGCONT, &sa, &old) == 0) {
      previous_.push_back({SIGCONT, old});
      kill_watch_ = std::make_unique<KillSequenceWatch>();
    }
  }
}

StopSignals::~StopSignals() {
  kill_watch_.reset();
  for (const auto& [s, old] : previous_) ::sigaction(s, &old, nullptr);
}

int StopSignals::requested() {
  return g_requested.load();
}

void StopSignals::request(int signal) {
  int none = 0;
  g_requested.compare_exchange_strong(none, signal);
}

std::string StopSignals::name(int signal) {
  if (signal == kKillSequence)
    return "SIGCONT while running: the launcher's kill sequence (SIGTERM or SIGINT to mpirun, or a cancelled job)";
  for (const auto& [s, n] : kNames)
    if (s == signal) return n;
  return "signal " + std::to_string(signal);
}

const char* const StopSignals::kExitSignalChoices =
    "SIGTERM, SIGINT, SIGUSR1, SIGUSR2, SIGHUP, SIGQUIT, SIGALRM, SIGVTALRM, SIGPROF, SIGXCPU, SIGXFSZ, SIGPIPE, "
    "SIGCHLD, SIGCONT, SIGTSTP, SIGTTIN, SIGTTOU, SIGURG, SIGWINCH, SIGIO, SIGPWR";

int StopSignals::parse(const std::string& name) {
  for (const auto& [s, n] : kNames)
    if (name == n) return s;
  return 0;
}

}  // namespace moecore::train
