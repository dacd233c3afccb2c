// `moecore launch` (see launch.h).
#include "moecore/cli/launch_command.h"

#include <fmt/format.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <string>
#include <vector>

#include "moecore/core/error.h"

namespace moecore::cli {

namespace {
std::atomic<int> g_signals{0};  // SIGTERM/SIGINT received by the launcher
std::atomic<pid_t> g_child{0};

extern "C" void on_launcher_signal(int) {
  const int n = ++g_signals;
  const pid_t child = g_child.load();
  if (child > 0) ::kill(child, n == 1 ? SIGUSR1 : SIGTERM);
}

const char* kUsage =
    "usage: moecore launch [--nproc-per-node N] [--mpirun PATH] [--mpirun-arg ARG]... -- COMMAND [ARGS...]\n"
    "  Runs `mpirun [ARG...] -np N moecore COMMAND ARGS...`. The first SIGTERM or SIGINT asks every rank to stop\n"
    "  at the next step boundary and save (with --save); a second one ends the job at once.\n";

struct LaunchArgs {
  int64_t nproc = 1;
  std::string mpirun = "mpirun";
  std::vector<std::string> mpirun_args, command;
};

LaunchArgs parse(int argc, char** argv) {
  LaunchArgs a;
  int i = 2;
  auto value = [&](const std::string& flag) -> std::string {
    MOE_CHECK(i + 1 < argc, "moecore launch: {} needs a value\n{}", flag, kUsage);
    return argv[++i];
  };
  for (; i < argc; i++) {
    const std::string f = argv[i];
    if (f == "--") {
      i++;
      break;
    }
    if (f == "--nproc-per-node") {
      const std::string v = value(f);
      char* end = nullptr;
      a.nproc = std::strtoll(v.c_str(), &end, 10);
      MOE_CHECK(end && *end == '\0' && a.nproc >= 1 && a.nproc <= 1 << 20,
                "moecore launch: --nproc-per-node expects a positive integer, got '{}'", v);
    } else if (f == "--mpirun") {
      a.mpirun = value(f);
    } else if (f == "--mpirun-arg") {
      a.mpirun_args.push_back(value(f));
    } else {
      MOE_CHECK(false, "moecore launch: unknown option '{}' (the command goes after --)\n{}", f, kUsage);
    }
  }
  for (; i < argc; i++) a.command.push_back(argv[i]);
  MOE_CHECK(!a.command.empty(), "moecore launch: no command after --\n{}", kUsage);
  MOE_CHECK(a.command[0] != "launch", "moecore launch: the command cannot be launch itself");
  return a;
}

std::string self_exe() {
  std::vector<char> buf(4096);
  const ssize_t n = ::readlink("/proc/self/exe", buf.data(), buf.size() - 1);
  MOE_CHECK(n > 0, "moecore launch: cannot find its own executable (/proc/self/exe: {})", std::strerror(errno));
  return std::string(buf.data(), static_cast<size_t>(n));
}
}  // namespace

int run_launch(int argc, char** argv) {
  const LaunchArgs a = parse(argc, argv);
  std::vector<std::string> words = {a.mpirun};
  words.insert(words.end(), a.mpirun_args.begin(), a.mpirun_args.end());
  words.insert(words.end(), {"-np", std::to_string(a.nproc), self_exe()});
  words.insert(words.end(), a.command.begin(), a.command.end());
  std::vector<char*> cargv;
  for (auto& w : words) cargv.push_back(w.data());
  cargv.push_back(nullptr);

  struct sigaction sa {};
  sa.sa_handler = on_launcher_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;  // waitpid returns EINTR, so each signal is reported
  struct sigaction old_term {
  }, old_int{};
  ::sigaction(SIGTERM, &sa, &old_term);
  ::sigaction(SIGINT, &sa, &old_int);
  std::fflush(nullptr);
  const pid_t child = ::fork();
  MOE_CHECK(child >= 0, "moecore launch: fork failed: {}", std::strerror(errno));
  if (child == 0) {
    ::sigaction(SIGTERM, &old_term, nullptr);
    ::sigaction(SIGINT, &old_int, nullptr);
    ::setsid();  // its own session: a terminal's Ctrl-C reaches the launcher only
    ::execvp(cargv[0], cargv.data());
    fmt::print(stderr, "moecore launch: cannot run {}: {}\n", a.mpirun, std::strerror(errno));
    ::_exit(127);
  }
  g_child = child;
  if (g_signals.load() > 0) ::kill(child, SIGUSR1);  // a signal that came before the child's pid was known
  int status = 0;
  int reported = 0;
  while (::waitpid(child, &status, 0) < 0) {
    MOE_CHECK(errno == EINTR, "moecore launch: waiting for {} failed: {}", a.mpirun, std::strerror(errno));
    const int n = g_signals.load();
    if (n > reported) {
      fmt::print(stderr, "{}\n",
                 n == 1 ? "moecore launch: stopping every rank at the next step boundary (signal again to end the "
                          "job at once)"
                        : "moecore launch: ending the job at once");
      reported = n;
    }
  }
  ::sigaction(SIGTERM, &old_term, nullptr);
  ::sigaction(SIGINT, &old_int, nullptr);
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

}  // namespace moecore::cli
