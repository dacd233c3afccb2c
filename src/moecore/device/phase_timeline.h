// The bookkeeping of the GPU's phase table (cuda/gpu_profile.h), free of CUDA so the CPU tests check it with a fake
// clock (tests/core/test_phase_timeline.cpp): a stack of the phases entered on the compute stream, a marker recorded
// wherever the innermost phase changes, each span between two markers counted for the phase innermost during it,
// and the ledger of host synchronisations by call site. Not a profiler of kernels: one number per phase per step.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "moecore/core/error.h"

namespace moecore::device {

// What a span of the step counts for; the innermost phase wins (the router's GEMM is GEMM time).
enum class Phase : int { kRest, kGemm, kAttention, kPermute, kRouter, kNorm, kActivation, kLoss, kCast, kOptimizer };
constexpr int kPhaseCount = 10;

inline const char* phase_label(Phase p) {
  switch (p) {
    case Phase::kGemm:
      return "GEMM (cuBLASLt, grouped expert GEMMs)";
    case Phase::kAttention:
      return "attention kernels";
    case Phase::kPermute:
      return "token permutation";
    case Phase::kRouter:
      return "router";
    case Phase::kNorm:
      return "norms (RMSNorm, LayerNorm)";
    case Phase::kActivation:
      return "activations (SwiGLU, GeLU)";
    case Phase::kLoss:
      return "embedding, cross-entropy";
    case Phase::kCast:
      return "dtype casts (f32 <-> bf16)";
    case Phase::kOptimizer:
      return "optimizer (grad norm, clip, AdamW)";
    case Phase::kRest:
      break;
  }
  return "the rest (RoPE, adds, copies, gaps)";
}
// A short key for the benchmark's one-line record (gemm_s=...).
inline const char* phase_key(Phase p) {
  constexpr std::array<const char*, kPhaseCount> keys = {"other", "gemm", "attention", "permute", "router",
                                                         "norm",  "act",  "loss",      "cast",    "optimizer"};
  return keys[static_cast<int>(p)];
}

// The phases modules mark with a TimerScope (core/timers.h) rather than at the kernel level; kRest for any other
// timer, which the table ignores.
inline Phase phase_of_timer(std::string_view name) {
  if (name == "attention-core") return Phase::kAttention;
  if (name == "moe-permute") return Phase::kPermute;
  if (name == "moe-router") return Phase::kRouter;
  if (name == "optimizer") return Phase::kOptimizer;
  return Phase::kRest;
}

// Records numbered markers on the timed stream and reads the time between two (CUDA events on a GPU).
class MarkerClock {
 public:
  virtual ~MarkerClock() = default;
  virtual void record(size_t i) = 0;
  virtual void wait(size_t i) = 0;  // the host waits until marker i has been reached
  virtual double seconds(size_t from, size_t to) = 0;
};

class PhaseTimeline {
 public:
  explicit PhaseTimeline(MarkerClock& clock) : clock_(clock) {}

  // Scopes enter and leave a phase; `tag` says who opened it (0: a kernel-level scope, strictly nested; a timer's
  // phase + 1: a TimerScope, which may close out of order with other timers), and leave removes the innermost entry
  // with that tag. Outside a step only the stack changes.
  void enter(Phase p, int tag) {
    stack_.push_back({p, tag});
    if (in_step_) entries_[static_cast<int>(p)]++;
    changed();
  }
  void leave(int tag) {
    for (size_t i = stack_.size(); i-- > 0;) {
      if (stack_[i].tag == tag) {
        stack_.erase(stack_.begin() + static_cast<std::ptrdiff_t>(i));
        changed();
        return;
      }
    }
  }
  Phase innermost() const { return stack_.empty() ? Phase::kRest : stack_.back().phase; }

  void begin_step() {
    MOE_ASSERT_MSG(!in_step_, "a step begins before the previous one ended");
    stack_.clear();  // a scope left open across steps (an exception, a stream switch) must not colour this one
    markers_.clear();
    in_step_ = true;
    mark();
  }
  // Records the last marker, waits for it (the one host synchronisation of the profile per step) and adds the step's
  // spans to the totals.
  void end_step() {
    MOE_ASSERT_MSG(in_step_, "a step ends that did not begin");
    mark();
    in_step_ = false;
    const size_t last = markers_.size() - 1;
    clock_.wait(last);
    for (size_t i = 0; i < last; i++) seconds_[static_cast<int>(markers_[i])] += clock_.seconds(i, i + 1);
    step_seconds_ += clock_.seconds(0, last);
    steps_++;
    max_markers_ = std::max(max_markers_, markers_.size());
  }
  void reset() {
    seconds_.fill(0.0);
    entries_.fill(0);
    step_seconds_ = 0;
    steps_ = 0;
  }

  int steps() const { return steps_; }
  double step_seconds() const { return step_seconds_; }  // summed over the steps
  double seconds(Phase p) const { return seconds_[static_cast<int>(p)]; }
  // Scopes entered for `p` inside the steps (kernel entry points and timers): roughly its launches.
  int64_t entries(Phase p) const { return entries_[static_cast<int>(p)]; }
  size_t max_markers() const { return max_markers_; }

 private:
  struct Entry {
    Phase phase;
    int tag;
  };
  void changed() {
    if (in_step_ && innermost() != markers_.back()) mark();
  }
  void mark() {
    clock_.record(markers_.size());
    markers_.push_back(innermost());
  }

  MarkerClock& clock_;
  std::vector<Entry> stack_;
  std::vector<Phase> markers_;  // markers_[i]: the phase from marker i to marker i + 1
  bool in_step_ = false;
  std::array<double, kPhaseCount> seconds_{};
  std::array<int64_t, kPhaseCount> entries_{};
  double step_seconds_ = 0;
  int steps_ = 0;
  size_t max_markers_ = 0;
};

// Host synchronisations by call site: what synchronised (a copy to the host, a stream synchronisation), the phase it
// happened in, and the return addresses of the call (symbolised by the caller of top()).
class SyncLedger {
 public:
  struct Site {
    std::string what;
    Phase phase = Phase::kRest;
    std::vector<uintptr_t> frames;
    int64_t count = 0;
    double bytes = 0, blocked_s = 0;
  };
  void note(std::string_view what, Phase phase, const std::vector<uintptr_t>& frames, size_t bytes, double blocked_s) {
    Site& s = sites_[Key{std::string(what), static_cast<int>(phase), frames}];
    if (s.count == 0) s.what = what, s.phase = phase, s.frames = frames;
    s.count++;
    s.bytes += static_cast<double>(bytes);
    s.blocked_s += blocked_s;
    total_++;
    blocked_s_ += blocked_s;
  }
  // The n sites with the most synchronisations (ties: the longer wait first, then the order of the keys).
  std::vector<Site> top(size_t n) const {
    std::vector<Site> all;
    for (const auto& [k, s] : sites_) all.push_back(s);
    std::stable_sort(all.begin(), all.end(), [](const Site& a, const Site& b) {
      return a.count != b.count ? a.count > b.count : a.blocked_s > b.blocked_s;
    });
    if (all.size() > n) all.resize(n);
    return all;
  }
  int64_t total() const { return total_; }
  double blocked_seconds() const { return blocked_s_; }
  size_t sites() const { return sites_.size(); }
  void reset() {
    sites_.clear();
    total_ = 0;
    blocked_s_ = 0;
  }

 private:
  using Key = std::tuple<std::string, int, std::vector<uintptr_t>>;
  std::map<Key, Site> sites_;
  int64_t total_ = 0;
  double blocked_s_ = 0;
};

}  // namespace moecore::device
