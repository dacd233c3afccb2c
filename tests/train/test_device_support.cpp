// What GPU training covers (train/device_support.h), checked without a GPU: every setting it does not cover is named
// in the reason, a covered configuration has none, and --device cpu always trains on the CPU.
#include <gtest/gtest.h>

#include "config_util.h"
#include "moecore/train/config/device_support.h"
#include "moecore/train/config/start_config.h"
#include "test_util.h"

namespace moecore {
namespace {

using testing::operator+;

train::TrainConfig config(const std::vector<std::string>& extra) {
  return testing::small_config(testing::tiny_moe_flags() + testing::mock_run_flags(32, 2, 4, 64, 2, "1e-3"), extra);
}

TEST(DeviceSupport, CoveredSettingsHaveNoGap) {
  EXPECT_EQ(train::gpu_training_gap(config({})), "");
  EXPECT_EQ(train::gpu_training_gap(config({"--position-embedding-type", "learned_absolute", "--normalization",
                                            "LayerNorm", "--use-distributed-optimizer", "--bf16"})),
            "");
  // Dropout trains on the GPU with the CPU's masks (Megatron's defaults, 0.1 each).
  EXPECT_EQ(train::gpu_training_gap(config({"--hidden-dropout", "0.1", "--attention-dropout", "0.1"})), "");
  // Context parallelism trains on the GPU with every --cp-comm-type.
  for (const char* type : {"p2p", "a2a", "allgather"}) {
    train::TrainConfig c = config({"--cp-comm-type", type});
    c.context_parallel_size = 2;
    EXPECT_EQ(train::gpu_training_gap(c), "") << type;
  }
}

TEST(DeviceSupport, EachUncoveredSettingIsNamed) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--optimizer", "sgd"}, "--optimizer sgd"},
      {{"--log-num-zeros-in-grad"}, "--log-num-zeros-in-grad"},
      {{"--moe-router-dtype", "fp64"}, "--moe-router-dtype fp64"},
  };
  for (const auto& [flags, name] : cases) {
    const std::string gap = train::gpu_training_gap(config(flags));
    EXPECT_TRUE(testing::contains(gap, name)) << name << ": " << gap;
    EXPECT_TRUE(testing::contains(gap, "not supported by moecore on the GPU")) << gap;
  }
}

// The GPU's dropout kernels take micro-batches of up to 128 sequences (their sample indices ride in the launch).
TEST(DeviceSupport, DropoutOverLargeMicroBatchesIsNamed) {
  train::TrainConfig c = config({"--hidden-dropout", "0.1"});
  c.micro_batch_size = 129;
  const std::string gap = train::gpu_training_gap(c);
  EXPECT_TRUE(testing::contains(gap, "dropout with --micro-batch-size 129")) << gap;
  c.hidden_dropout = 0;
  EXPECT_EQ(train::gpu_training_gap(c), "");
}

TEST(DeviceSupport, CpuIsAlwaysTheCpu) {
  train::TrainConfig c = config({"--hidden-dropout", "0.1", "--device", "cpu"});
  std::string why;
  EXPECT_TRUE(train::training_device(c, &why).is_cpu());
  EXPECT_EQ(why, "");  // no fallback happened: the CPU was asked for
}

}  // namespace
}  // namespace moecore
