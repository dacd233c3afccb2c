// Megatron's --bf16 layout under the distributed optimizer on two data-parallel ranks, shown by the allocator:
// bf16 weights (2 bytes), fp32 main gradients (4), the fp32 master and both moments sharded (12 / DP): 6 + 12/DP =
// 12 bytes per bf16 parameter (an f32-kept one: 8 + 8/DP, also 12). Replicated over DP2: 18. One rank:
// tests/optim/test_mixed_precision_bytes.cpp. --fp16 holds the same bytes, and its sharded and replicated runs agree.
#include <gtest/gtest.h>

#include "config_util.h"
#include "moecore/train/trainer.h"
#include "optim/state_bytes.h"

namespace moecore {
namespace {

using testing::operator+;

std::vector<std::string> dp_bytes_model() {
  return testing::state_bytes_model() + std::vector<std::string>{"--bf16"};
}

TEST(MixedPrecisionLayouts, DistributedOptimizerHoldsSixPlusTwelveOverDpBytes) {
  const comm::ProcessGroup w = comm::ProcessGroup::world();
  if (w.size() != 2) GTEST_SKIP() << "runs on 2 ranks";
  const testing::StateBytes s =
      testing::state_bytes(testing::small_config(dp_bytes_model(), {"--use-distributed-optimizer"}), &w);
  testing::expect_layout(s, "bf16 distributed optimizer DP2 rank " + std::to_string(w.rank()), 0.02);
  EXPECT_NEAR(s.measured / s.params, 6.0 + 12.0 / 2, 0.25);
}

// --fp16 holds the same bytes as --bf16: f16 weights in their own buckets, the f32 masters sharded beside the moments.
TEST(MixedPrecisionLayouts, Fp16DistributedOptimizerHoldsTheBf16Bytes) {
  const comm::ProcessGroup w = comm::ProcessGroup::world();
  if (w.size() != 2) GTEST_SKIP() << "runs on 2 ranks";
  const std::vector<std::string> fp16 = {"--fp16", "--accumulate-allreduce-grads-in-fp32", "--initial-loss-scale",
                                         "4096", "--use-distributed-optimizer"};
  const testing::StateBytes s = testing::state_bytes(testing::small_config(testing::state_bytes_model(), fp16), &w);
  testing::expect_layout(s, "fp16 distributed optimizer DP2 rank " + std::to_string(w.rank()), 0.02);
  EXPECT_NEAR(s.measured / s.params, 6.0 + 12.0 / 2, 0.25);
}

// Sharded and replicated AdamW give one fp16 run over DP2 (the grad norm's partial sums aside).
TEST(MixedPrecisionLayouts, Fp16ShardedMatchesReplicated) {
  const comm::ProcessGroup w = comm::ProcessGroup::world();
  if (w.size() != 2) GTEST_SKIP() << "runs on 2 ranks";
  std::FILE* null = std::fopen("/dev/null", "w");
  std::vector<std::vector<train::StepResult>> runs;
  for (const std::vector<std::string> opt : {std::vector<std::string>{}, {"--use-distributed-optimizer"}}) {
    train::TrainConfig c = testing::small_config(
        testing::state_bytes_model(),
        std::vector<std::string>{"--fp16", "--accumulate-allreduce-grads-in-fp32", "--initial-loss-scale", "4096"} +
            opt);
    c.device = "cpu";
    train::resolve(c);
    train::Trainer t(c, null, false, &w);
    runs.emplace_back();
    for (int i = 0; i < 3; i++) runs.back().push_back(t.train_step());
  }
  for (size_t i = 0; i < runs[0].size(); i++) {
    EXPECT_FALSE(runs[0][i].skipped) << "step " << i;
    EXPECT_NEAR(runs[0][i].lm_loss, runs[1][i].lm_loss, 1e-6 * runs[0][i].lm_loss) << "step " << i;
  }
  std::fclose(null);
}

TEST(MixedPrecisionLayouts, ReplicatedHoldsEighteenBytes) {
  const comm::ProcessGroup w = comm::ProcessGroup::world();
  if (w.size() != 2) GTEST_SKIP() << "runs on 2 ranks";
  const testing::StateBytes s = testing::state_bytes(testing::small_config(dp_bytes_model()), &w);
  testing::expect_layout(s, "bf16 replicated DP2 rank " + std::to_string(w.rank()), 0.02);
  EXPECT_NEAR(s.measured / s.params, 18.0, 0.25);
}

// --ddp-bucket-size changes how gradients are bucketed, never the numbers: the same losses (and the same grad norms
// but for the shards' partial sums' rounding) with Megatron's size-based buckets as with one per layer, replicated
// and under the distributed optimizer.
TEST(MixedPrecisionLayouts, BucketSizeChangesNoNumbers) {
  const comm::ProcessGroup w = comm::ProcessGroup::world();
  if (w.size() != 2) GTEST_SKIP() << "runs on 2 ranks";
  std::FILE* null = std::fopen("/dev/null", "w");
  for (const std::vector<std::string> opt : {std::vector<std::string>{}, {"--use-distributed-optimizer"}}) {
    std::vector<train::StepResult> per_layer, sized;
    for (const std::vector<std::string> bucket : {std::vector<std::string>{}, {"--ddp-bucket-size", "20000"}}) {
      train::TrainConfig c = testing::small_config(dp_bytes_model(), testing::operator+(opt, bucket));
      c.device = "cpu";
      train::resolve(c);
      train::Trainer t(c, null, false, &w);
      for (int i = 0; i < 3; i++) (bucket.empty() ? per_layer : sized).push_back(t.train_step());
    }
    for (size_t i = 0; i < per_layer.size(); i++) {
      EXPECT_EQ(per_layer[i].lm_loss, sized[i].lm_loss) << "step " << i << (opt.empty() ? " replicated" : " sharded");
      EXPECT_NEAR(per_layer[i].grad_norm, sized[i].grad_norm, 1e-12 * per_layer[i].grad_norm) << "step " << i;
    }
  }
  std::fclose(null);
}

}  // namespace
}  // namespace moecore
