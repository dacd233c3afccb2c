// The collective watchdog (see watchdog.h).
#include "moecore/comm/watchdog.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <thread>

#include "moecore/comm/mpi_check.h"
#include "moecore/core/timer.h"

namespace moecore::comm {

namespace {
double g_timeout = 600;  // Megatron's default, until the program sets its flag
std::string g_source = "--distributed-timeout-minutes 10";
MPI_Comm g_wd = MPI_COMM_NULL;
const WaitSite* g_current = nullptr;  // what this rank waits on now (answered to queries)

constexpr int kQueryTag = 7101, kAnswerTag = 7102;
constexpr int kSpin = 64;  // MPI_Test calls before the back-off starts: short collectives never sleep

// A rank's answer: where it waits. Fixed size, so no message can be truncated.
struct Report {
  int32_t waiting = 0;
  uint64_t seq = 0;
  char group[40] = {};
  char op[24] = {};
};

Report report_of(const WaitSite* s) {
  Report r;
  if (!s) return r;
  r.waiting = 1;
  r.seq = s->seq;
  std::snprintf(r.group, sizeof(r.group), "%s", s->group ? s->group->c_str() : "");
  std::snprintf(r.op, sizeof(r.op), "%s", s->op);
  return r;
}

bool point_to_point(const char* op) {
  return std::strcmp(op, "send") == 0 || std::strcmp(op, "recv") == 0;
}

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

// Answers every query that has arrived with where this rank waits now. Sends are non-blocking; their buffers live
// until the send completes.
struct Outgoing {
  MPI_Request req = MPI_REQUEST_NULL;
  Report r;
};
std::vector<std::unique_ptr<Outgoing>>& outgoing() {
  static std::vector<std::unique_ptr<Outgoing>> v;
  return v;
}
void isend(int dst, int tag, const Report& r) {
  auto o = std::make_unique<Outgoing>();
  o->r = r;
  if (MPI_Isend(&o->r, sizeof(Report), MPI_BYTE, dst, tag, g_wd, &o->req) == MPI_SUCCESS)
    outgoing().push_back(std::move(o));
}
void reap_sends() {
  auto& v = outgoing();
  v.erase(std::remove_if(v.begin(), v.end(),
                         [](const std::unique_ptr<Outgoing>& o) {
                           int done = 0;
                           MPI_Test(&o->req, &done, MPI_STATUS_IGNORE);
                           return done != 0;
                         }),
          v.end());
}

void service_queries() {
  if (g_wd == MPI_COMM_NULL) return;
  for (;;) {
    int flag = 0;
    MPI_Status st;
    if (MPI_Iprobe(MPI_ANY_SOURCE, kQueryTag, g_wd, &flag, &st) != MPI_SUCCESS || !flag) break;
    Report q;
    MPI_Recv(&q, sizeof(Report), MPI_BYTE, st.MPI_SOURCE, kQueryTag, g_wd, MPI_STATUS_IGNORE);
    isend(st.MPI_SOURCE, kAnswerTag, report_of(g_current));
  }
  reap_sends();
}

std::string group_words(const std::string& g) {
  static const std::map<std::string, std::string> names = {
      {"dp", "data-parallel"},           {"tp", "tensor-parallel"},
      {"ep", "expert-parallel"},         {"edp", "expert-data-parallel"},
      {"etp", "expert-tensor-parallel"}, {"tp-dp", "tensor-and-data-parallel"},
      {"world", "world (all ranks)"},    {"group", "unnamed"}};
  const auto it = names.find(g);
  return it == names.end() ? g : it->second;
}

std::string op_words(const char* op) {
  static const std::map<std::string, std::string> names = {{"all_reduce", "all-reduce"},
                                                           {"all_gather", "all-gather"},
                                                           {"all_gather_v", "all-gather"},
                                                           {"reduce_scatter", "reduce-scatter"},
                                                           {"reduce_scatter_v", "reduce-scatter"},
                                                           {"all_to_all_v", "all-to-all"},
                                                           {"broadcast", "broadcast"},
                                                           {"barrier", "barrier"},
                                                           {"send", "send"},
                                                           {"recv", "receive"}};
  const auto it = names.find(op);
  return it == names.end() ? std::string(op) : it->second;
}

// Past the deadline: ask every rank where it waits, wait a grace period for answers, name the missing, end the
// job. Every rank that times out asks everyone, so they all see the same answers and only the lowest waiting rank
// reports.
[[noreturn]] void expire(const WaitSite& site, double waited) {
  const int me = world_rank();
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  const Report mine = report_of(&site);
  if (g_wd != MPI_COMM_NULL)
    for (int r = 0; r < world; r++)
      if (r != me) isend(r, kQueryTag, mine);
  const double grace = std::clamp(g_timeout / 4, 1.0, 10.0);
  std::map<int, Report> answers;
  answers[me] = mine;
  const double t0 = now_seconds();
  while (g_wd != MPI_COMM_NULL && now_seconds() - t0 < grace && static_cast<int>(answers.size()) < world) {
    int flag = 0;
    MPI_Status st;
    if (MPI_Iprobe(MPI_ANY_SOURCE, kAnswerTag, g_wd, &flag, &st) == MPI_SUCCESS && flag) {
      Report a;
      MPI_Recv(&a, sizeof(Report), MPI_BYTE, st.MPI_SOURCE, kAnswerTag, g_wd, MPI_STATUS_IGNORE);
      answers[st.MPI_SOURCE] = a;
      continue;
    }
    service_queries();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  const std::string group = site.group ? *site.group : "";
  const std::vector<int> members = site.members ? *site.members : std::vector<int>{};
  std::vector<int> arrived, elsewhere_ranks, silent;
  std::vector<std::string> elsewhere;
  for (int r = 0; r < world; r++) {
    const auto it = answers.find(r);
    const bool member = r == me || std::find(members.begin(), members.end(), r) != members.end();
    if (it == answers.end() || !it->second.waiting) {
      silent.push_back(r);
      continue;
    }
    const Report& a = it->second;
    const bool here =
        r == me || (group == a.group && (point_to_point(site.op) ? point_to_point(a.op) : a.seq >= site.seq));
    if (member && here) {
      arrived.push_back(r);
    } else if (member) {
      elsewhere_ranks.push_back(r);
      elsewhere.push_back(fmt::format("rank {} waits at {} (collective #{} of its {} group)", r,
                                      describe_site(a.group, a.op), a.seq, a.group));
    }
  }
  std::vector<int> missing;
  for (int r : members)
    if (std::find(arrived.begin(), arrived.end(), r) == arrived.end()) missing.push_back(r);
  std::string text = fmt::format(
      "moecore: {} (collective #{} of the {} group) on rank {} has waited {:.1f} s, longer than {} allows.\n"
      "  ranks of that group that did not arrive: {}\n  ranks waiting there: {}\n",
      describe_site(group, site.op), site.seq, group, me, waited, g_source,
      missing.empty() ? std::string("none found") : fmt::format("{}", fmt::join(missing, ", ")),
      fmt::join(arrived, ", "));
  for (const auto& e : elsewhere) text += "  " + e + "\n";
  text += fmt::format(
      "  ranks in no collective (stalled, deadlocked in computation, or dead): {}\n"
      "Ending the job; if those ranks are only slow, raise {}.\n",
      silent.empty() ? std::string("none") : fmt::format("{}", fmt::join(silent, ", ")), g_source);
  // The lowest rank that waits somewhere reports (each timed-out rank computes the same set).
  int reporter = me;
  for (const auto& [r, a] : answers)
    if (a.waiting && r < reporter) reporter = r;
  if (me == reporter) {
    std::fputs(text.c_str(), stderr);
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  // The reporter ends the job; should it not, this rank does after a while.
  const double t1 = now_seconds();
  while (now_seconds() - t1 < 3 * grace) {
    service_queries();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  std::fputs(text.c_str(), stderr);
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::_Exit(1);
}
}  // namespace

void set_collective_timeout(double seconds, const std::string& source) {
  g_timeout = seconds;
  g_source = source;
}

double collective_timeout() {
  return g_timeout;
}

const std::string& collective_timeout_source() {
  return g_source;
}

void init_watchdog() {
  if (g_wd != MPI_COMM_NULL) return;
  MOE_MPI(MPI_Comm_dup(MPI_COMM_WORLD, &g_wd));
  MOE_MPI(MPI_Comm_set_errhandler(g_wd, MPI_ERRORS_RETURN));
}

void free_watchdog() {
  if (g_wd == MPI_COMM_NULL) return;
  for (auto& o : outgoing()) MPI_Cancel(&o->req);
  outgoing().clear();
  MPI_Comm_free(&g_wd);
  g_wd = MPI_COMM_NULL;
}

int wait_with_watchdog(MPI_Request* req, const WaitSite& site) {
  int flag = 0;
  for (int i = 0; i < kSpin; i++) {
    const int rc = MPI_Test(req, &flag, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS || flag) return rc;
  }
  if (g_timeout <= 0) return MPI_Wait(req, MPI_STATUS_IGNORE);
  const double t0 = now_seconds();
  const WaitSite* outer = g_current;
  g_current = &site;
  int rc = MPI_SUCCESS;
  for (int64_t polls = 0;; polls++) {
    rc = MPI_Test(req, &flag, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS || flag) break;
    const double waited = now_seconds() - t0;
    if ((polls & 15) == 0 || waited > 0.01) service_queries();
    if (waited > g_timeout) expire(site, waited);
    // Back-off: yield first (the peer may share this core), then sleep up to 1 ms once the wait is long.
    if (waited < 0.005)
      sched_yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(waited < 0.1 ? 50 : 1000));
  }
  g_current = outer;
  return rc;
}

std::string describe_site(const std::string& group, const char* op) {
  if (point_to_point(op)) return fmt::format("a {} on the {} group", op_words(op), group_words(group));
  return fmt::format("{} on the {} group", op_words(op), group_words(group));
}

}  // namespace moecore::comm
