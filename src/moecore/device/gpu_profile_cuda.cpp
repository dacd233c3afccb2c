// The GPU profile of a training step (see gpu_profile.h): CUDA events as the phase timeline's markers, the timer
// observer that maps TimerScopes to phases, and the host-synchronisation ledger with its call sites' addresses.
#include <cxxabi.h>
#include <dlfcn.h>
#include <execinfo.h>
#include <fmt/format.h>
#include <link.h>
#include <unistd.h>

#include <cstdlib>

#include "moecore/core/error.h"
#include "moecore/core/timer.h"
#include "moecore/core/timers.h"
#include "moecore/device/check.h"
#include "moecore/device/gpu_profile.h"
#include "moecore/device/stream.h"

namespace moecore::device {

namespace profile_detail {
// Markers are timing events on the profiled stream, created as the first steps need them and reused after.
class EventClock final : public MarkerClock {
 public:
  explicit EventClock(cudaStream_t s) : s_(s) {}
  ~EventClock() override {
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
  }
  void record(size_t i) override {
    while (events_.size() <= i) {
      cudaEvent_t e = nullptr;
      MOE_CUDA_CHECK(cudaEventCreate(&e));
      events_.push_back(e);
    }
    MOE_CUDA_CHECK(cudaEventRecord(events_[i], s_));
  }
  void wait(size_t i) override {
    const double t0 = now_seconds();
    MOE_CUDA_CHECK(cudaEventSynchronize(events_[i]));
    waited_s += now_seconds() - t0;
  }
  double seconds(size_t from, size_t to) override {
    float ms = 0;
    MOE_CUDA_CHECK(cudaEventElapsedTime(&ms, events_[from], events_[to]));
    return ms * 1e-3;
  }

 private:
  cudaStream_t s_;
  std::vector<cudaEvent_t> events_;

 public:
  double waited_s = 0;  // the host's waits at the ends of the steps
};
}  // namespace profile_detail

namespace {

// "file+0xOFFSET" for addr2line (OFFSET relative to the object's load bias, so it works for PIE and non-PIE
// binaries alike); a shared library's frame by its demangled dynamic symbol where it has one. The main program's
// frames always by offset: it exports no symbols, and dladdr could name a wrong neighbour.
std::string describe_frame(uintptr_t pc) {
  const uintptr_t at = pc - 1;  // a return address points after the call
  struct Find {
    uintptr_t at;
    std::string file;
    uintptr_t bias = 0;
    bool found = false;
  } f{at, {}, 0, false};
  dl_iterate_phdr(
      [](dl_phdr_info* i, size_t, void* p) {
        auto* f = static_cast<Find*>(p);
        for (int k = 0; k < i->dlpi_phnum; k++) {
          const ElfW(Phdr)& ph = i->dlpi_phdr[k];
          const uintptr_t lo = i->dlpi_addr + ph.p_vaddr;
          if (ph.p_type == PT_LOAD && f->at >= lo && f->at < lo + ph.p_memsz) {
            f->file = i->dlpi_name && *i->dlpi_name ? i->dlpi_name : "";
            f->bias = i->dlpi_addr;
            f->found = true;
            return 1;
          }
        }
        return 0;
      },
      &f);
  if (!f.found) return fmt::format("0x{:x}", at);
  std::string file = f.file;
  if (file.empty()) {  // the main program
    char buf[4096];
    const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
    file = n > 0 ? std::string(buf, static_cast<size_t>(n)) : "exe";
  } else {
    Dl_info info{};
    if (dladdr(reinterpret_cast<void*>(at), &info) && info.dli_sname) {
      int st = 0;
      char* d = abi::__cxa_demangle(info.dli_sname, nullptr, nullptr, &st);
      std::string name = st == 0 && d ? d : info.dli_sname;
      std::free(d);
      if (const size_t paren = name.find('('); paren != std::string::npos) name.resize(paren);
      return name;
    }
  }
  if (const size_t slash = file.rfind('/'); slash != std::string::npos) file = file.substr(slash + 1);
  return fmt::format("{}+0x{:x}", file, at - f.bias);
}
}  // namespace

struct GpuProfiler::Impl final : TimerObserver {
  explicit Impl(Device d) : device(d), stream(current_stream()), clock(stream), timeline(clock) {}
  void started(const std::string& name) override {
    const Phase p = phase_of_timer(name);
    if (p != Phase::kRest && current_stream() == stream) timeline.enter(p, 1 + static_cast<int>(p));
  }
  void stopped(const std::string& name) override {
    const Phase p = phase_of_timer(name);
    if (p != Phase::kRest && current_stream() == stream) timeline.leave(1 + static_cast<int>(p));
  }

  Device device;
  cudaStream_t stream;
  profile_detail::EventClock clock;
  PhaseTimeline timeline;
  SyncLedger ledger;
  TimerObserver* previous_observer = nullptr;
  bool in_step = false;
};

namespace profile_detail {
GpuProfiler::Impl* g_active = nullptr;

bool enter(Phase p) {
  if (current_stream() != g_active->stream) return false;
  g_active->timeline.enter(p, 0);
  return true;
}
void leave() {
  if (g_active) g_active->timeline.leave(0);
}
void note_sync(const char* what, size_t bytes, double blocked_s) {
  GpuProfiler::Impl* a = g_active;
  if (!a->in_step) return;  // the benchmark's own synchronisations between steps
  void* pcs[16];
  const int n = backtrace(pcs, 16);
  std::vector<uintptr_t> frames;
  for (int i = 2; i < n && frames.size() < 10; i++) frames.push_back(reinterpret_cast<uintptr_t>(pcs[i]));
  a->ledger.note(what, a->timeline.innermost(), frames, bytes, blocked_s);
}
double now() {
  return now_seconds();
}
}  // namespace profile_detail

GpuProfiler::GpuProfiler(Device d) {
  MOE_CHECK(d.is_cuda(), "the GPU profile needs a GPU device, got {}", d.str());
  MOE_CHECK(!profile_detail::g_active, "one GPU profile at a time on a process");
  impl_ = std::make_unique<Impl>(d);
  impl_->previous_observer = Timers::set_observer(impl_.get());
  profile_detail::g_active = impl_.get();
}

GpuProfiler::~GpuProfiler() {
  profile_detail::g_active = nullptr;
  Timers::set_observer(impl_->previous_observer);
}

void GpuProfiler::begin_step() {
  impl_->timeline.begin_step();
  impl_->in_step = true;
}

void GpuProfiler::end_step() {
  impl_->in_step = false;
  impl_->timeline.end_step();
}

void GpuProfiler::reset() {
  impl_->clock.waited_s = 0;
  impl_->timeline.reset();
  impl_->ledger.reset();
}

GpuProfileReport GpuProfiler::report(size_t top_sites) const {
  GpuProfileReport r;
  const PhaseTimeline& t = impl_->timeline;
  r.steps = t.steps();
  if (r.steps == 0) return r;
  const double n = r.steps;
  r.step_s = t.step_seconds() / n;
  for (int p = 0; p < kPhaseCount; p++) {
    r.phase_s[p] = t.seconds(static_cast<Phase>(p)) / n;
    r.entries[p] = static_cast<double>(t.entries(static_cast<Phase>(p))) / n;
  }
  r.markers = static_cast<double>(t.max_markers());
  r.syncs_per_step = static_cast<double>(impl_->ledger.total()) / n;
  r.blocked_s_per_step = impl_->ledger.blocked_seconds() / n;
  r.end_wait_s_per_step = impl_->clock.waited_s / n;
  r.distinct_sites = static_cast<int>(impl_->ledger.sites());
  for (const SyncLedger::Site& s : impl_->ledger.top(top_sites)) {
    GpuProfileReport::Site o{s.what,
                             s.phase,
                             static_cast<double>(s.count) / n,
                             s.bytes / static_cast<double>(s.count),
                             1e3 * s.blocked_s / n,
                             {}};
    for (uintptr_t pc : s.frames) o.frames.push_back(describe_frame(pc));
    r.top_sites.push_back(std::move(o));
  }
  return r;
}

}  // namespace moecore::device
