// Stop requests by signal (see signals.h).
#include "moecore/train/signals.h"

#include <unistd.h>

#include <atomic>

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

StopSignals::StopSignals(const std::vector<int>& signals) {
  g_requested = 0;
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // a signal never fails a read or write half-way
  for (int s : signals) {
    struct sigaction old {};
    if (::sigaction(s, &sa, &old) == 0) previous_.push_back({s, old});
  }
}

StopSignals::~StopSignals() {
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
