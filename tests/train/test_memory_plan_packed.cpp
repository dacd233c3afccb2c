// The memory plan counts the packed copies of the expert weights a bf16 step on the CPU keeps
// (kernels::PackedWeight, two layouts per weight): after a step, the packed buffers the model's parameters hold add
// up to what the plan added for them; nothing is added for f32, or where this CPU has no bf16 matmul.
#include <gtest/gtest.h>

#include <cstdio>

#include "config_util.h"
#include "moecore/core/allocator.h"
#include "moecore/kernels/cpu/gemm.h"
#include "moecore/train/memory_plan.h"
#include "moecore/train/trainer.h"

namespace moecore {
namespace {

using testing::operator+;

std::vector<std::string> packed_model() {
  return train::override_flags(testing::tiny_moe_flags(), {"--hidden-size", "64", "--moe-ffn-hidden-size", "96"}) +
         testing::mock_run_flags(64, 2, 2, 256, 2, "1e-3");
}

TEST(MemoryPlanPacked, CountsThePackedExpertWeightsAStepHolds) {
  const train::TrainConfig c = testing::small_config(packed_model(), {"--bf16"});
  const train::MemoryPlan plan = train::plan_memory(c, 256, train::PlanLayout{}, 0);
  const double planned = plan.bf16_weights - 2 * plan.params;
  std::FILE* null = std::fopen("/dev/null", "w");
  train::Trainer t(c, null, false);
  t.train_step();
  std::fclose(null);
  double held = 0;
  for (const auto& p : t.params().all())
    for (const kernels::PackedWeight& w : p->packed_cache)
      if (w.packed.defined()) held += static_cast<double>(Allocator::round_size(w.packed.nbytes()));
  if (!kernels::gemm_stats().bf16_native) {
    EXPECT_EQ(held, 0);
    EXPECT_EQ(planned, 0);
    return;
  }
  EXPECT_GT(held, 0) << "a bf16 step packs its expert weights";
  EXPECT_NEAR(planned, held, 1e-9 * held) << "planned " << planned << " B, held " << held << " B";
  const train::TrainConfig f32 = testing::small_config(packed_model(), {});
  const train::MemoryPlan p32 = train::plan_memory(f32, 256, train::PlanLayout{}, 0);
  EXPECT_EQ(p32.bf16_weights, 0);
}

}  // namespace
}  // namespace moecore
