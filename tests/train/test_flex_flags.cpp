// The flex token dispatcher's flags (train/config/flag_table_dispatcher.cpp, config_validate_moe.cpp): Megatron's
// defaults, its rules for --moe-enable-deepep, --moe-flex-dispatcher-backend and padding to capacity with their
// messages, what it accepts (hybridep with padding, flex with both overlaps, the backend flags without flex), the
// NCCL EP backend refused by name, and the GPU's refusal of flex under expert parallelism.
#include <gtest/gtest.h>

#include "config_util.h"
#include "moecore/train/config/device_support.h"
#include "moecore/train/config/start_config.h"
#include "test_util.h"

namespace moecore {
namespace {

using testing::operator+;

std::vector<std::string> flex_base() {
  return train::override_flags(testing::tiny_moe_flags(), {"--num-experts", "8"}) +
         testing::mock_run_flags(16, 2, 4, 64, 1, "1e-3") +
         std::vector<std::string>{"--expert-model-parallel-size", "2"};
}
std::string flex_error_of(const std::vector<std::string>& extra) {
  return testing::error_of([&] { testing::small_config(flex_base(), extra); });
}
const std::vector<std::string> kFlex{"--moe-token-dispatcher-type", "flex"};
const std::vector<std::string> kPad{"--moe-expert-capacity-factor", "1.0", "--moe-pad-expert-input-to-capacity"};

TEST(FlexFlags, MegatronsDefaults) {
  const train::TrainConfig c = testing::small_config(flex_base(), kFlex);
  EXPECT_EQ(c.moe_token_dispatcher_type, "flex");
  EXPECT_EQ(c.moe_flex_dispatcher_backend, "deepep");
  EXPECT_FALSE(c.moe_enable_deepep);
  EXPECT_TRUE(train::moe_layer_config(c).flex_dispatcher);
  EXPECT_FALSE(train::moe_layer_config(testing::small_config(flex_base(), {})).flex_dispatcher);
}

TEST(FlexFlags, MegatronsRulesWithTheirMessages) {
  EXPECT_TRUE(
      testing::contains(flex_error_of({"--moe-enable-deepep"}), "only supported with the flex token dispatcher"));
  EXPECT_TRUE(testing::contains(
      flex_error_of(kFlex +
                    std::vector<std::string>{"--moe-enable-deepep", "--moe-flex-dispatcher-backend", "hybridep"}),
      "only one backend is supported"));
  // deepep (the default backend, or the older switch) refuses padding to capacity; hybridep takes it.
  EXPECT_TRUE(testing::contains(flex_error_of(kFlex + kPad), "--moe-pad-expert-input-to-capacity"));
  EXPECT_TRUE(testing::contains(flex_error_of(kFlex + kPad + std::vector<std::string>{"--moe-enable-deepep"}),
                                "deepep backend does not support"));
  EXPECT_EQ(flex_error_of(kFlex + kPad + std::vector<std::string>{"--moe-flex-dispatcher-backend", "hybridep"}), "");
  // Padding with other dispatchers is untouched by flex's rule, and so is capacity dropping with deepep.
  EXPECT_EQ(flex_error_of(kPad + std::vector<std::string>{"--moe-flex-dispatcher-backend", "deepep"}), "");
  EXPECT_EQ(flex_error_of(kFlex + std::vector<std::string>{"--moe-expert-capacity-factor", "1.0"}), "");
  // DeepEP's dispatcher needs TPxEP > 1; HybridEP's does not.
  EXPECT_TRUE(testing::contains(flex_error_of(kFlex + std::vector<std::string>{"--expert-model-parallel-size", "1"}),
                                "requires TPxEP > 1"));
  EXPECT_EQ(flex_error_of(kFlex + std::vector<std::string>{"--expert-model-parallel-size", "1",
                                                           "--moe-flex-dispatcher-backend", "hybridep"}),
            "");
  // ncclep: needs flex (Megatron's rule), and is refused by name with the backends to use instead.
  EXPECT_TRUE(testing::contains(flex_error_of({"--moe-flex-dispatcher-backend", "ncclep"}),
                                "requires --moe-token-dispatcher-type flex"));
  const std::string nccl = flex_error_of(kFlex + std::vector<std::string>{"--moe-flex-dispatcher-backend", "ncclep"});
  EXPECT_TRUE(testing::contains(nccl, "not supported by moecore") && testing::contains(nccl, "hybridep")) << nccl;
  EXPECT_TRUE(
      testing::contains(flex_error_of({"--moe-flex-dispatcher-backend", "nvshmem"}), "--moe-flex-dispatcher-backend"));
}

TEST(FlexFlags, OverlapsAcceptFlexAsMegatronDoes) {
  EXPECT_EQ(flex_error_of(kFlex + std::vector<std::string>{"--moe-shared-expert-intermediate-size", "32",
                                                           "--moe-shared-expert-overlap"}),
            "");
  EXPECT_EQ(flex_error_of(kFlex + std::vector<std::string>{"--overlap-moe-expert-parallel-comm",
                                                           "--delay-wgrad-compute", "--bf16"}),
            "");
  EXPECT_TRUE(
      testing::contains(flex_error_of({"--moe-token-dispatcher-type", "allgather",
                                       "--moe-shared-expert-intermediate-size", "32", "--moe-shared-expert-overlap"}),
                        "alltoall or flex token dispatcher"));
}

TEST(FlexFlags, TheGpuRefusesFlexUnderExpertParallelism) {
  const std::string gap = train::gpu_training_gap(testing::small_config(flex_base(), kFlex));
  EXPECT_TRUE(testing::contains(gap, "--moe-token-dispatcher-type flex")) << gap;
  EXPECT_TRUE(testing::contains(gap, "not supported by moecore on the GPU")) << gap;
  EXPECT_EQ(train::gpu_training_gap(testing::small_config(
                flex_base(), kFlex + std::vector<std::string>{"--expert-model-parallel-size", "1",
                                                              "--moe-flex-dispatcher-backend", "hybridep"})),
            "");
}

}  // namespace
}  // namespace moecore
