// Megatron's --bf16 layout under the distributed optimizer on two data-parallel ranks, shown by the allocator:
// bf16 weights (2 bytes), fp32 main gradients (4), the fp32 master and both moments sharded (12 / DP): 6 + 12/DP =
// 12 bytes per bf16 parameter (an f32-kept one: 8 + 8/DP, also 12). Replicated over DP2: 18. One rank:
// tests/optim/test_mixed_precision_bytes.cpp.
#include <gtest/gtest.h>

#include "config_util.h"
#include "optim/state_bytes.h"

namespace moecore {
namespace {

using testing::operator+;

std::vector<std::string> dp_bytes_model() {
  return std::vector<std::string>{"--num-layers",
                                  "2",
                                  "--hidden-size",
                                  "128",
                                  "--ffn-hidden-size",
                                  "256",
                                  "--num-attention-heads",
                                  "4",
                                  "--swiglu",
                                  "--disable-bias-linear",
                                  "--num-experts",
                                  "4",
                                  "--moe-router-topk",
                                  "2",
                                  "--moe-ffn-hidden-size",
                                  "256",
                                  "--untie-embeddings-and-output-weights",
                                  "--bf16"} +
         testing::rmsnorm_rope_flags() + testing::mock_run_flags(32, 2, 4, 128, 3, "1e-3");
}

TEST(MixedPrecisionLayouts, DistributedOptimizerHoldsSixPlusTwelveOverDpBytes) {
  const comm::ProcessGroup w = comm::ProcessGroup::world();
  if (w.size() != 2) GTEST_SKIP() << "runs on 2 ranks";
  const testing::StateBytes s =
      testing::state_bytes(testing::small_config(dp_bytes_model(), {"--use-distributed-optimizer"}), &w);
  testing::expect_layout(s, "bf16 distributed optimizer DP2 rank " + std::to_string(w.rank()), 0.02);
  EXPECT_NEAR(s.measured / s.params, 6.0 + 12.0 / 2, 0.25);
}

TEST(MixedPrecisionLayouts, ReplicatedHoldsEighteenBytes) {
  const comm::ProcessGroup w = comm::ProcessGroup::world();
  if (w.size() != 2) GTEST_SKIP() << "runs on 2 ranks";
  const testing::StateBytes s = testing::state_bytes(testing::small_config(dp_bytes_model()), &w);
  testing::expect_layout(s, "bf16 replicated DP2 rank " + std::to_string(w.rank()), 0.02);
  EXPECT_NEAR(s.measured / s.params, 18.0, 0.25);
}

}  // namespace
}  // namespace moecore
