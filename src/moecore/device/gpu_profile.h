// Where a GPU training step's time goes, for `bench train --device cuda`: CUDA events on the compute stream mark
// each change of phase (kernel-level PhaseScopes in kernels/cuda, and the TimerScopes of phase_of_timer), and are
// read once per step after one synchronisation, so timing never serialises the streams; and every host
// synchronisation (a copy to or from the host, a stream or event synchronisation) is counted by call site. Host-only
// header (no CUDA). Costs one pointer test per scope and per synchronisation when no profiler is installed.
// Work on other streams (the grouped GEMMs' 4 streams, the shared-expert stream) counts for the compute stream's
// phase while the compute stream waits for it; scopes opened on another stream are ignored.
#pragma once

#include <array>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "moecore/core/device.h"
#include "moecore/device/phase_timeline.h"

namespace moecore::device {

struct GpuProfileReport {
  struct Site {
    std::string what;  // "copy device->host", "stream synchronize", ...
    Phase phase;       // the innermost phase on the compute stream when it happened
    double per_step, bytes_per_call, blocked_ms_per_step;
    std::vector<std::string> frames;  // "moecore+0x1a2b3c" (addr2line -C -f -e BINARY 0x1a2b3c), or a symbol
  };
  int steps = 0;
  double step_s = 0;                                  // per step, first marker to last, on the compute stream
  std::array<double, kPhaseCount> phase_s{};          // per step, by Phase
  std::array<double, kPhaseCount> entries{};          // per step: scopes entered by Phase (~ the kernel entry calls)
  double markers = 0;                                 // events recorded in the longest step
  double syncs_per_step = 0, blocked_s_per_step = 0;  // the host's waits in synchronisations during the step
  double end_wait_s_per_step = 0;                     // and at its end, for the queued work to finish
  int distinct_sites = 0;
  std::vector<Site> top_sites;
};

class GpuProfiler {
 public:
  // Installs itself (one at a time per process) for the calling thread's current stream on `d`. A CPU-only build
  // throws.
  explicit GpuProfiler(Device d);
  ~GpuProfiler();
  GpuProfiler(const GpuProfiler&) = delete;
  GpuProfiler& operator=(const GpuProfiler&) = delete;

  void begin_step();
  void end_step();  // one synchronisation on the compute stream (not counted), then the events are read
  void reset();     // forget the steps so far (after a warm-up)
  GpuProfileReport report(size_t top_sites) const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

namespace profile_detail {
extern GpuProfiler::Impl* g_active;  // null unless a GpuProfiler is installed
bool enter(Phase p);                 // false when the current stream is not the profiled one
void leave();
void note_sync(const char* what, size_t bytes, double blocked_s);
double now();
}  // namespace profile_detail

// Counts the enclosing kernel launches for phase `p` (innermost wins) while a profiler is installed.
class PhaseScope {
 public:
  explicit PhaseScope(Phase p) : on_(profile_detail::g_active && profile_detail::enter(p)) {}
  ~PhaseScope() {
    if (on_) profile_detail::leave();
  }
  PhaseScope(const PhaseScope&) = delete;
  PhaseScope& operator=(const PhaseScope&) = delete;

 private:
  bool on_;
};

// Wraps a call that blocks the host until the GPU catches up: counted, with the host's wait, while a profiler is
// installed.
class SyncProbe {
 public:
  SyncProbe(const char* what, size_t bytes) : what_(profile_detail::g_active ? what : nullptr), bytes_(bytes) {
    if (what_) t0_ = profile_detail::now();
  }
  ~SyncProbe() {
    if (what_ && profile_detail::g_active) profile_detail::note_sync(what_, bytes_, profile_detail::now() - t0_);
  }
  SyncProbe(const SyncProbe&) = delete;
  SyncProbe& operator=(const SyncProbe&) = delete;

 private:
  const char* what_;
  size_t bytes_;
  double t0_ = 0;
};

// A profiler for `d`'s work where `d` is a GPU; none for the CPU (its phases are the timers').
inline std::unique_ptr<GpuProfiler> profiler_for(Device d) {
  return d.is_cuda() ? std::make_unique<GpuProfiler>(d) : nullptr;
}

}  // namespace moecore::device
