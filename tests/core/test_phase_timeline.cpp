// The bookkeeping of bench train's GPU phase table (cuda/phase_timeline.h) with a fake clock: the innermost phase
// owns each span, the spans add up to the step, markers only where the phase changes and only inside a step, one
// wait per step; the synchronisation ledger's sites; and the timer observer that feeds TimerScopes to it (the timers'
// own behaviour unchanged).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "moecore/core/timers.h"
#include "moecore/device/gpu_profile.h"
#include "moecore/device/phase_timeline.h"

namespace moecore::device {
namespace {

// Marker i is "recorded" at the test's current time `now`.
class FakeClock final : public MarkerClock {
 public:
  void record(size_t i) override {
    if (at.size() <= i) at.resize(i + 1);
    at[i] = now;
    records++;
  }
  void wait(size_t i) override { waits.push_back(i); }
  double seconds(size_t from, size_t to) override { return at[to] - at[from]; }
  double now = 0;
  int records = 0;
  std::vector<double> at;
  std::vector<size_t> waits;
};

constexpr int kScope = 0;
int timer_tag(Phase p) {
  return 1 + static_cast<int>(p);
}

TEST(PhaseTimeline, TheInnermostPhaseOwnsEachSpanAndTheSpansAddUpToTheStep) {
  FakeClock c;
  PhaseTimeline t(c);
  t.begin_step();  // t = 0, rest
  c.now = 1;
  t.enter(Phase::kGemm, kScope);
  c.now = 3;
  t.leave(kScope);
  t.enter(Phase::kRouter, timer_tag(Phase::kRouter));  // same instant: a zero-length rest span
  c.now = 4;
  t.enter(Phase::kGemm, kScope);  // the router's GEMM is GEMM time
  c.now = 6;
  t.leave(kScope);
  c.now = 7;
  t.leave(timer_tag(Phase::kRouter));
  c.now = 10;
  t.end_step();
  EXPECT_DOUBLE_EQ(t.seconds(Phase::kGemm), 4.0);
  EXPECT_DOUBLE_EQ(t.seconds(Phase::kRouter), 2.0);
  EXPECT_DOUBLE_EQ(t.seconds(Phase::kRest), 4.0);
  EXPECT_DOUBLE_EQ(t.step_seconds(), 10.0);
  double sum = 0;
  for (int p = 0; p < kPhaseCount; p++) sum += t.seconds(static_cast<Phase>(p));
  EXPECT_DOUBLE_EQ(sum, t.step_seconds());
  EXPECT_EQ(t.steps(), 1);
  EXPECT_EQ(t.entries(Phase::kGemm), 2);  // entries counted inside the step
  EXPECT_EQ(t.entries(Phase::kRouter), 1);
  ASSERT_EQ(c.waits.size(), 1u);  // one wait per step, on the last marker
  EXPECT_EQ(c.waits[0], c.at.size() - 1);
}

TEST(PhaseTimeline, MarkersOnlyWhereThePhaseChangesAndOnlyInsideAStep) {
  FakeClock c;
  PhaseTimeline t(c);
  t.enter(Phase::kGemm, kScope);  // before the step: the stack changes, nothing is recorded or counted
  t.leave(kScope);
  EXPECT_EQ(c.records, 0);
  EXPECT_EQ(t.entries(Phase::kGemm), 0);
  t.begin_step();
  EXPECT_EQ(c.records, 1);
  t.enter(Phase::kGemm, kScope);
  t.enter(Phase::kGemm, kScope);  // a GEMM inside a GEMM: no change
  t.leave(kScope);
  EXPECT_EQ(c.records, 2);
  t.leave(kScope);
  EXPECT_EQ(c.records, 3);
  t.end_step();
  EXPECT_EQ(c.records, 4);
  EXPECT_EQ(t.max_markers(), 4u);
}

TEST(PhaseTimeline, ATimerClosedOutOfOrderLeavesTheKernelScopeInside) {
  FakeClock c;
  PhaseTimeline t(c);
  t.begin_step();
  t.enter(Phase::kOptimizer, timer_tag(Phase::kOptimizer));
  t.enter(Phase::kNorm, kScope);
  t.leave(timer_tag(Phase::kOptimizer));  // the timer below the scope goes; the scope stays innermost
  EXPECT_EQ(t.innermost(), Phase::kNorm);
  t.leave(kScope);
  EXPECT_EQ(t.innermost(), Phase::kRest);
  t.leave(kScope);  // nothing left with that tag: ignored
  t.end_step();
}

TEST(PhaseTimeline, AScopeLeftOpenDoesNotColourTheNextStepAndResetForgets) {
  FakeClock c;
  PhaseTimeline t(c);
  t.begin_step();
  t.enter(Phase::kAttention, kScope);  // never left (an exception in the step)
  c.now = 2;
  t.end_step();
  EXPECT_DOUBLE_EQ(t.seconds(Phase::kAttention), 2.0);
  t.begin_step();
  c.now = 5;
  t.end_step();
  EXPECT_DOUBLE_EQ(t.seconds(Phase::kAttention), 2.0);
  EXPECT_DOUBLE_EQ(t.seconds(Phase::kRest), 3.0);
  t.reset();
  EXPECT_EQ(t.steps(), 0);
  EXPECT_DOUBLE_EQ(t.step_seconds(), 0.0);
  EXPECT_DOUBLE_EQ(t.seconds(Phase::kRest), 0.0);
}

TEST(SyncLedger, GroupsByCallSiteAndRanksByCount) {
  SyncLedger l;
  const std::vector<uintptr_t> a{1, 2, 3}, b{1, 2, 4};
  for (int i = 0; i < 3; i++) l.note("copy device->host", Phase::kRouter, a, 8, 0.001);
  l.note("copy device->host", Phase::kPermute, b, 512, 0.002);
  l.note("copy device->host", Phase::kPermute, b, 512, 0.002);
  l.note("stream synchronize", Phase::kRest, a, 0, 0.5);  // same frames, another kind: another site
  EXPECT_EQ(l.total(), 6);
  EXPECT_EQ(l.sites(), 3u);
  EXPECT_NEAR(l.blocked_seconds(), 0.507, 1e-12);
  const auto top = l.top(2);
  ASSERT_EQ(top.size(), 2u);
  EXPECT_EQ(top[0].count, 3);
  EXPECT_EQ(top[0].phase, Phase::kRouter);
  EXPECT_EQ(top[0].frames, a);
  EXPECT_DOUBLE_EQ(top[0].bytes, 24.0);
  EXPECT_EQ(top[1].count, 2);
  EXPECT_EQ(top[1].phase, Phase::kPermute);
  l.reset();
  EXPECT_EQ(l.total(), 0);
  EXPECT_TRUE(l.top(5).empty());
}

TEST(PhaseTimeline, TimerNamesMapToThePhasesOfTheTable) {
  EXPECT_EQ(phase_of_timer("moe-router"), Phase::kRouter);
  EXPECT_EQ(phase_of_timer("moe-permute"), Phase::kPermute);
  EXPECT_EQ(phase_of_timer("attention-core"), Phase::kAttention);
  EXPECT_EQ(phase_of_timer("optimizer"), Phase::kOptimizer);
  EXPECT_EQ(phase_of_timer("forward-compute"), Phase::kRest);
  for (int p = 0; p < kPhaseCount; p++) {
    EXPECT_NE(std::string(phase_label(static_cast<Phase>(p))), "");
    EXPECT_NE(std::string(phase_key(static_cast<Phase>(p))), "");
  }
}

class RecordingObserver final : public TimerObserver {
 public:
  void started(const std::string& n) override { log.push_back("+" + n); }
  void stopped(const std::string& n) override { log.push_back("-" + n); }
  std::vector<std::string> log;
};

TEST(TimerObserver, SeesEnabledTimersOnlyAndLeavesTheTimersAsTheyWere) {
  RecordingObserver o;
  Timers timers(1);
  const Timers::Install install(&timers);
  TimerObserver* previous = Timers::set_observer(&o);
  {
    TimerScope a("optimizer", 1);
    TimerScope b("moe-router", 2);  // above the log level: neither timed nor seen
  }
  EXPECT_EQ(Timers::set_observer(previous), &o);
  EXPECT_EQ(o.log, (std::vector<std::string>{"+optimizer", "-optimizer"}));
  EXPECT_TRUE(timers.has("optimizer"));
  EXPECT_FALSE(timers.has("moe-router"));
  { TimerScope c("optimizer", 1); }  // observer removed: not seen
  EXPECT_EQ(o.log.size(), 2u);
}

TEST(GpuProfile, ScopesAndProbesDoNothingWithoutAProfiler) {
  ASSERT_EQ(profile_detail::g_active, nullptr);
  const PhaseScope scope(Phase::kGemm);
  const SyncProbe probe("copy device->host", 8);
  EXPECT_EQ(profile_detail::g_active, nullptr);
}

}  // namespace
}  // namespace moecore::device
