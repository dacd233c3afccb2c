// Stop requests by signal (see signals.h).
#include "moecore/train/signals.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
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

// The kill-sequence watch (signals.h): the handler stamps the SIGCONT, the ticker thread judges it.
std::atomic<int64_t> g_cont_ns{0};  // CLOCK_MONOTONIC of a SIGCONT not yet judged (0: none)
static_assert(std::atomic<int64_t>::is_always_lock_free, "the handler may only touch lock-free atomics");

int64_t monotonic_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);  // async-signal-safe
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

extern "C" void on_cont_signal(int) {
  g_cont_ns.store(monotonic_ns());
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

// Ticks every 50 ms. A tick that took half a second longer means the whole process was stopped (SIGSTOP, SIGTSTP)
// and has just been resumed; a SIGCONT more than a second away from such a resume resumed nothing, so it is the
// first signal of a kill sequence and becomes a stop request. The verdict waits 200 ms after the SIGCONT, so the
// tick spanning a stop has ended by then.
class KillSequenceWatch {
 public:
  KillSequenceWatch() : thread_([this] { run(); }) {}
  ~KillSequenceWatch() {
    done_ = true;
    thread_.join();
  }

 private:
  void run() {
    constexpr int64_t kMs = 1000000, kTick = 50 * kMs;
    int64_t last = monotonic_ns(), resumed = last - 3600000 * kMs;
    while (!done_) {
      std::this_thread::sleep_for(std::chrono::nanoseconds(kTick));
      const int64_t now = monotonic_ns();
      if (now - last > kTick + 500 * kMs) resumed = now;
      last = now;
      int64_t cont = g_cont_ns.load();
      if (cont == 0 || now - cont < 200 * kMs || !g_cont_ns.compare_exchange_strong(cont, 0)) continue;
      if (std::llabs(resumed - cont) > 1000 * kMs) StopSignals::request(StopSignals::kKillSequence);
    }
  }
  std::atomic<bool> done_{false};
  std::thread thread_;
};

StopSignals::StopSignals(const std::vector<int>& signals, bool kill_sequence) {
  g_requested = 0;
  g_cont_ns = 0;
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
