// Megatron FSDP's memory, measured by the allocator on every rank of a model whose parameters outweigh its
// activations: the plan (train/memory_plan_fsdp.cpp) within 10% of each rank's peak at DP2 and DP4 under every
// sharding strategy, and with full recompute; what a rank keeps between steps within 10% of the plan's state and,
// under optim_grads_params, halved from DP2 to DP4 (the sharded state falls as 1/DP); with
// --init-model-with-meta-device no rank ever holds its whole model (the trainer's construction peaks below the
// model's f32 bytes, where without it they pass them).
#include <gtest/gtest.h>

#include "../train/memory_measure.h"
#include "config_util.h"
#include "moecore/comm/process_group.h"

namespace moecore {
namespace {

using testing::operator+;

// Four layers H 128 (a dense first layer of FFN 512, then 8 experts of FFN 128), 32 tokens per micro-batch.
std::vector<std::string> fsdp_model(int64_t dp) {
  return train::override_flags(testing::tiny_moe_flags(), {"--num-layers", "4", "--hidden-size", "128",
                                                           "--moe-ffn-hidden-size", "128", "--num-experts", "8"}) +
         std::vector<std::string>{"--moe-layer-freq", "[0,1,1,1]", "--ffn-hidden-size", "512"} +
         testing::mock_run_flags(32, 1, dp, 256, 10, "1e-3");
}

std::vector<std::string> fsdp_strategy(const std::string& strategy) {
  return {"--use-megatron-fsdp", "--data-parallel-sharding-strategy", strategy};
}

class FsdpMemory : public ::testing::TestWithParam<std::string> {};

TEST_P(FsdpMemory, PlanWithinTenPercentOfPeakAndState) {
  const comm::ProcessGroup w = comm::ProcessGroup::world();
  const std::string& s = GetParam();
  const testing::MeasuredMemory m =
      testing::measure_memory(testing::small_config(fsdp_model(w.size()), fsdp_strategy(s)), &w);
  const std::string what = s + " DP" + std::to_string(w.size()) + " rank " + std::to_string(w.rank());
  testing::expect_plan_matches(m, what, 0.10, false);
  std::printf("%s: state planned %.3f MiB, held between steps %.3f MiB (%.2f bytes per parameter)\n", what.c_str(),
              m.state / 0x1p20, m.held / 0x1p20, m.held / (m.model / 4));
  EXPECT_NEAR(m.held, m.state, 0.10 * m.state) << what;
}

INSTANTIATE_TEST_SUITE_P(Strategies, FsdpMemory,
                         ::testing::Values("no_shard", "optim", "optim_grads", "optim_grads_params"));

// Full recompute of two layers per chunk, with and without the double buffer: the replay gathers one unit at a time,
// releasing each after its forward, so the plan's two units in flight hold (within 10% of each rank's peak).
TEST(FsdpMemoryRecompute, ReplayHoldsOneUnitAtATime) {
  const comm::ProcessGroup w = comm::ProcessGroup::world();
  const std::vector<std::string> full{"--recompute-granularity", "full", "--recompute-method", "uniform",
                                      "--recompute-num-layers",  "2"};
  for (const bool double_buffer : {false, true}) {
    std::vector<std::string> extra = fsdp_strategy("optim_grads_params") + full;
    if (double_buffer) extra.push_back("--fsdp-double-buffer");
    const testing::MeasuredMemory m = testing::measure_memory(testing::small_config(fsdp_model(w.size()), extra), &w);
    testing::expect_plan_matches(m,
                                 std::string(double_buffer ? "double buffer" : "plain") + " full recompute DP" +
                                     std::to_string(w.size()) + " rank " + std::to_string(w.rank()),
                                 0.10, false);
  }
}

// The same model at DP4 (the world) and DP2 (each half of it): optim_grads_params' state halves.
TEST(FsdpMemoryScaling, ShardedStateFallsAsOneOverDP) {
  const comm::ProcessGroup w = comm::ProcessGroup::world();
  if (w.size() != 4) GTEST_SKIP() << "runs on 4 ranks";
  const comm::ProcessGroup half = w.split({{0, 1}, {2, 3}});
  const testing::MeasuredMemory m4 =
      testing::measure_memory(testing::small_config(fsdp_model(4), fsdp_strategy("optim_grads_params")), &w);
  const testing::MeasuredMemory m2 =
      testing::measure_memory(testing::small_config(fsdp_model(2), fsdp_strategy("optim_grads_params")), &half);
  std::printf("rank %d: held DP2 %.3f MiB, DP4 %.3f MiB (ratio %.3f); model %.3f MiB\n", static_cast<int>(w.rank()),
              m2.held / 0x1p20, m4.held / 0x1p20, m2.held / m4.held, m4.model / 0x1p20);
  EXPECT_NEAR(m2.held / m4.held, 2.0, 0.2);
  EXPECT_NEAR(m2.state / m4.state, 2.0, 0.05);
}

// --init-model-with-meta-device: each rank initialises only its shards. With Adam's moments in bf16 (Megatron's
// precision-aware optimizer) a DP4 rank's state is 3/4 of its model's f32 bytes, and building the trainer never
// takes more; without the flag the model is built whole first.
TEST(FsdpMemoryScaling, MetaDeviceInitNeverHoldsTheWholeModel) {
  const comm::ProcessGroup w = comm::ProcessGroup::world();
  if (w.size() != 4) GTEST_SKIP() << "runs on 4 ranks";
  const std::vector<std::string> args = fsdp_model(4) + fsdp_strategy("optim_grads_params") +
                                        std::vector<std::string>{"--use-precision-aware-optimizer", "--exp-avg-dtype",
                                                                 "bf16", "--exp-avg-sq-dtype", "bf16"};
  const testing::MeasuredMemory meta =
      testing::measure_memory(testing::small_config(args, {"--init-model-with-meta-device"}), &w);
  const testing::MeasuredMemory whole = testing::measure_memory(testing::small_config(args), &w);
  std::printf("rank %d: model %.3f MiB; built with meta-device init %.3f MiB, without %.3f MiB\n",
              static_cast<int>(w.rank()), meta.model / 0x1p20, meta.built / 0x1p20, whole.built / 0x1p20);
  EXPECT_LT(meta.built, meta.model);
  EXPECT_GT(whole.built, meta.model);
}

}  // namespace
}  // namespace moecore
