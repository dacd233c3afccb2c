// What the measured-memory-plan tests share: train a configuration for three steps and take the allocator's peak
// over the third (everything the run holds, weights to activations, less what was live before the trainer), the
// system allocations during it, and the plan for the same rank (train/memory_plan.h).
#pragma once

#include <gtest/gtest.h>

#include <cstdio>

#include "moecore/comm/process_group.h"
#include "moecore/core/allocator.h"
#include "moecore/train/memory_plan.h"
#include "moecore/train/model_builder.h"
#include "moecore/train/trainer.h"

namespace moecore::testing {

struct MeasuredMemory {
  double peak = 0;         // bytes: the allocator's peak during step 3, less the bytes live before the run
  double planned = 0;      // the plan's total for this rank
  double activations = 0;  // the plan's activations (stashes at the schedule's peak + backward working set)
  double working = 0;      // the plan's backward working set
  int64_t new_allocs = 0;  // system allocations during step 3
  double held = 0;         // bytes live after step 3 (less those before the run): what a rank keeps between steps
  double built = 0;        // the allocator's peak while the trainer was built (less the bytes live before)
  double model = 0;        // bytes of this rank's parameters, whole, in f32 (its share of the model without sharding)
  double state = 0;        // the plan's weights, gradients, moments, masters and bf16 copies (kept between steps)
};

// `warmup` steps first (the allocator's cache filled), then the measured one. On the CPU, whose allocator is the
// one measured, even where a GPU is visible (--device auto would train there).
inline MeasuredMemory measure_memory(train::TrainConfig c, const comm::ProcessGroup* world = nullptr, int warmup = 2) {
  c.device = "cpu";
  train::resolve(c);
  Allocator& a = Allocator::instance();
  MeasuredMemory m;
  const int64_t before = a.stats().live_bytes;
  std::FILE* null = std::fopen("/dev/null", "w");
  int64_t pp_rank = 0;
  {
    a.reset_peak();
    train::Trainer t(c, null, false, world);
    m.built = static_cast<double>(t.startup_peak_bytes() - before);
    for (const auto& p : t.params().all()) m.model += 4.0 * static_cast<double>(p->value.numel());
    for (int i = 0; i < warmup; i++) t.train_step();
    a.reset_peak();
    const AllocatorMark mark = a.mark();
    t.train_step();
    m.peak = static_cast<double>(a.stats().peak_bytes - before);
    m.new_allocs = a.system_allocs_since(mark);
    m.held = static_cast<double>(a.stats().live_bytes - before);
    if (t.pipeline()) pp_rank = world ? world->rank() / (world->size() / c.pipeline_model_parallel_size) : 0;
  }
  std::fclose(null);
  const int64_t n = world ? world->size() : 1;
  const train::MemoryPlan p =
      train::plan_memory(c, train::build_vocabulary(c).padded, train::PlanLayout::from(c, n), pp_rank);
  m.planned = p.total();
  m.activations = p.peak_activations + p.working;
  m.working = p.working;
  m.state = p.weights + p.grads + p.adam + p.master + p.bf16_weights;
  return m;
}

// The plan within `rel` of the measured peak, and a third step that takes no memory from the system.
inline void expect_plan_matches(const MeasuredMemory& m, const std::string& what, double rel = 0.10,
                                bool steady = true) {
  std::printf("%s: planned %.3f MiB, measured peak %.3f MiB\n", what.c_str(), m.planned / 0x1p20, m.peak / 0x1p20);
  EXPECT_NEAR(m.planned, m.peak, rel * m.peak)
      << what << ": planned " << m.planned / 0x1p20 << " MiB, measured peak " << m.peak / 0x1p20
      << " MiB (activations planned " << m.activations / 0x1p20 << " MiB, of which backward working set "
      << m.working / 0x1p20 << " MiB)";
  if (steady) {
    EXPECT_EQ(m.new_allocs, 0) << what << ": step 3 allocated from the system";
  }
}

}  // namespace moecore::testing
