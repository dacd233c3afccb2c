// The memory plan counts the packed copies of the expert weights a bf16 step on the CPU keeps
// (kernels::PackedWeight, two layouts per weight, from 4 micro-batches on): after a step, the packed buffers the
// model's parameters hold add up to what the plan added for them; nothing is held or added with 2 micro-batches, for
// f32, or where this CPU has no bf16 matmul.
#include <gtest/gtest.h>

#include <cstdio>
#include <utility>

#include "config_util.h"
#include "moecore/core/allocator.h"
#include "moecore/kernels/gemm.h"
#include "moecore/train/memory_plan.h"
#include "moecore/train/trainer.h"

namespace moecore {
namespace {

using testing::operator+;

// 64 tokens per micro-batch of 2 sequences; global batch 8: 4 micro-batches.
std::vector<std::string> packed_model() {
  return train::override_flags(testing::tiny_moe_flags(), {"--hidden-size", "64", "--moe-ffn-hidden-size", "96"}) +
         testing::mock_run_flags(64, 2, 8, 256, 2, "1e-3");
}

// The plan's bytes for packed weights, and the packed bytes the parameters hold after one step.
std::pair<double, double> planned_and_held(const std::vector<std::string>& extra) {
  const train::TrainConfig c = testing::small_config(packed_model(), extra);
  train::PlanLayout one;
  one.num_microbatches = c.global_batch_size / c.micro_batch_size;
  const train::MemoryPlan plan = train::plan_memory(c, 256, one, 0);
  std::FILE* null = std::fopen("/dev/null", "w");
  train::Trainer t(c, null, false);
  t.train_step();
  std::fclose(null);
  double held = 0;
  for (const auto& p : t.params().all())
    for (const kernels::PackedWeight& w : p->packed_cache)
      if (w.packed.defined()) held += static_cast<double>(Allocator::round_size(w.packed.nbytes()));
  // Besides the packed copies, the bf16 copy a tied output layer's f32 weight takes per step.
  EXPECT_DOUBLE_EQ(plan.packed_weights, plan.bf16_weights - 2 * train::count_params(c, 256, 1, 1, 0).bf16_copy);
  return {plan.packed_weights, held};
}

TEST(MemoryPlanPacked, CountsThePackedExpertWeightsAStepHolds) {
  const auto [planned, held] = planned_and_held({"--bf16", "--device", "cpu"});
  const auto [planned2, held2] = planned_and_held({"--bf16", "--device", "cpu", "--global-batch-size", "4"});
  EXPECT_EQ(planned2, 0);
  EXPECT_EQ(held2, 0) << "2 micro-batches: nothing packed";
  if (!kernels::gemm_stats().bf16_native) {
    EXPECT_EQ(held, 0);
    EXPECT_EQ(planned, 0);
    return;
  }
  EXPECT_GT(held, 0) << "a bf16 step of 4 micro-batches packs its expert weights";
  EXPECT_NEAR(planned, held, 1e-9 * held) << "planned " << planned << " B, held " << held << " B";
  const train::TrainConfig f32 = testing::small_config(packed_model(), {"--device", "cpu"});
  EXPECT_EQ(train::plan_memory(f32, 256, train::PlanLayout{}, 0).bf16_weights, 0);
  // A GPU run packs nothing (its experts' GEMMs are cuBLAS's), on any machine it is planned on.
  train::TrainConfig gpu = testing::small_config(packed_model(), {"--bf16", "--device", "cpu"});
  gpu.device = "cuda";
  train::PlanLayout four;
  four.num_microbatches = 4;
  EXPECT_EQ(train::plan_memory(gpu, 256, four, 0).packed_weights, 0);
}

}  // namespace
}  // namespace moecore
