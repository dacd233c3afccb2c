// What GPU training covers (train/device_support.h), checked without a GPU: every setting it does not cover is named
// in the reason, a covered configuration has none, --device cpu always trains on the CPU, and --device auto with a
// GPU visible refuses such a setting instead of moving the run to the CPU (the device choice is a pure function of
// the availability it is given).
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

device::DeviceAvailability gpus(int visible) {
  device::DeviceAvailability a;
  a.built_with_cuda = true;
  a.visible = visible;
  if (visible == 0) a.why_none = "no CUDA-capable device is detected";
  return a;
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
  // The optimizers, bf16 Adam moments, zero counting, Sinkhorn and a large top-k train on the GPU too.
  const std::vector<std::vector<std::string>> covered = {
      {"--optimizer", "sgd"},
      {"--optimizer", "muon"},
      {"--optimizer", "dist_muon"},
      {"--use-precision-aware-optimizer", "--exp-avg-dtype", "bf16", "--exp-avg-sq-dtype", "bf16",
       "--use-distributed-optimizer"},
      {"--log-num-zeros-in-grad"},
      {"--moe-router-load-balancing-type", "sinkhorn", "--moe-aux-loss-coeff", "0"},
  };
  for (const auto& flags : covered) {
    const std::string gap = train::gpu_training_gap(config(flags));
    EXPECT_EQ(gap, "") << flags[0];
  }
  train::TrainConfig c = config({});
  c.num_experts = 128;
  c.moe_router_topk = 72;  // above the permutation's register sort: sorted in memory
  EXPECT_EQ(train::gpu_training_gap(c), "");
}

TEST(DeviceSupport, EachUncoveredSettingIsNamed) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--moe-router-dtype", "fp64", "--device", "cpu"}, "--moe-router-dtype fp64"},
      {{"--bf16", "--loss-scale", "1024", "--device", "cpu"}, "loss scaling (--loss-scale)"},
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

// --fp16 trains on the CPU only (its kernels widen f16 operands there); the GPU refuses it by name.
TEST(DeviceSupport, Fp16IsNamed) {
  const train::TrainConfig c = config({"--fp16", "--accumulate-allreduce-grads-in-fp32", "--device", "cpu"});
  const std::string gap = train::gpu_training_gap(c);
  EXPECT_TRUE(testing::contains(gap, "--fp16")) << gap;
  EXPECT_TRUE(testing::contains(gap, "CPU-only")) << gap;
}

// bf16 main gradients (rounded and reduced on the host, optim/low_precision_grads.h) are named by their flags; fp32
// ones under --bf16 (its default) are covered.
TEST(DeviceSupport, Bf16MainGradientsAreNamed) {
  for (const std::vector<std::string>& flags :
       {std::vector<std::string>{"--bf16", "--grad-reduce-in-bf16"},
        std::vector<std::string>{"--bf16", "--use-precision-aware-optimizer", "--use-distributed-optimizer",
                                 "--main-grads-dtype", "bf16"}}) {
    const std::string gap = train::gpu_training_gap(config(flags + std::vector<std::string>{"--device", "cpu"}));
    EXPECT_TRUE(testing::contains(gap, "bf16 main gradients (--grad-reduce-in-bf16")) << gap;
  }
  EXPECT_EQ(train::gpu_training_gap(config({"--bf16", "--accumulate-allreduce-grads-in-fp32"})), "");
}

// Megatron's combined 1F1B schedule (--overlap-moe-expert-parallel-comm without --delay-wgrad-compute) runs on the
// CPU only; the GPU refuses it by name and keeps the split backward of --delay-wgrad-compute.
TEST(DeviceSupport, Combined1F1BIsNamed) {
  const std::vector<std::string> ep{"--expert-model-parallel-size",
                                    "2",
                                    "--moe-token-dispatcher-type",
                                    "alltoall",
                                    "--bf16",
                                    "--overlap-moe-expert-parallel-comm",
                                    "--device",
                                    "cpu"};
  const std::string gap = train::gpu_training_gap(config(ep));
  EXPECT_TRUE(testing::contains(gap, "--overlap-moe-expert-parallel-comm without --delay-wgrad-compute")) << gap;
  EXPECT_TRUE(testing::contains(gap, "CPU-only")) << gap;
  EXPECT_EQ(train::gpu_training_gap(config(ep + std::vector<std::string>{"--delay-wgrad-compute"})), "");
}

TEST(DeviceSupport, CpuIsAlwaysTheCpu) {
  train::TrainConfig c = config({"--hidden-dropout", "0.1", "--device", "cpu"});
  EXPECT_TRUE(train::training_device(c, gpus(1)).is_cpu());
  c.moe_router_dtype = "fp64";  // uncovered on the GPU, but the CPU was asked for
  EXPECT_TRUE(train::training_device(c, gpus(1)).is_cpu());
}

// auto with a GPU visible trains on it, and refuses (naming the setting and --device cpu) what the GPU does not
// cover instead of training on the CPU; without a GPU, or in a CPU-only build, auto is the CPU for any setting.
TEST(DeviceSupport, AutoWithAGpuVisibleNeverFallsBackToTheCpu) {
  train::TrainConfig c = config({"--device", "cpu"});
  c.device = "auto";
  EXPECT_TRUE(train::training_device(c, gpus(1)).is_cuda());
  c.moe_router_dtype = "fp64";
  const std::string e = testing::error_of([&] { train::training_device(c, gpus(2)); });
  EXPECT_TRUE(testing::contains(e, "--device auto")) << e;
  EXPECT_TRUE(testing::contains(e, "--moe-router-dtype fp64")) << e;
  EXPECT_TRUE(testing::contains(e, "does not fall back to the CPU")) << e;
  EXPECT_TRUE(testing::contains(e, "--device cpu")) << e;
  EXPECT_TRUE(train::training_device(c, gpus(0)).is_cpu());
  EXPECT_TRUE(train::training_device(c, device::DeviceAvailability{}).is_cpu());  // built without CUDA
  // --device cuda refuses it the same way, and asks for the CPU by name.
  c.device = "cuda";
  const std::string ec = testing::error_of([&] { train::training_device(c, gpus(1)); });
  EXPECT_TRUE(testing::contains(ec, "--device cuda: --moe-router-dtype fp64")) << ec;
  EXPECT_TRUE(testing::contains(ec, "use --device cpu")) << ec;
}

// `moecore plan` plans a GPU run on any machine: the GPU --device names is assumed present (a CUDA build, that
// ordinal visible), what GPU training does not cover is still refused by name, and auto keeps the real availability.
TEST(DeviceSupport, APlanAssumesTheGpuItNames) {
  const device::DeviceAvailability a = device::DeviceAvailability::assumed_for("cuda:3");
  EXPECT_TRUE(a.built_with_cuda);
  EXPECT_EQ(a.visible, 4);
  EXPECT_EQ(device::DeviceAvailability::assumed_for("cuda").visible, 1);
  const device::DeviceAvailability real = device::DeviceAvailability::probe();
  EXPECT_EQ(device::DeviceAvailability::assumed_for("auto").visible, real.visible);
  const auto flags = train::parse_flags(testing::tiny_moe_flags() + testing::mock_run_flags(32, 2, 4, 64, 2, "1e-3") +
                                        std::vector<std::string>{"--device", "cuda"});
  const train::TrainConfig c = train::compose_train_config(flags, /*plan_only=*/true);
  EXPECT_TRUE(c.plan_only);
  EXPECT_EQ(train::training_device(c), Device::cuda(0));
  if (real.visible == 0) {  // without a GPU, a run (not a plan) is refused as before
    const std::string e = testing::error_of([&] { train::compose_train_config(flags); });
    EXPECT_TRUE(testing::contains(e, "--device cuda")) << e;
  }
  train::TrainConfig fp64 = c;
  fp64.moe_router_dtype = "fp64";
  EXPECT_TRUE(testing::contains(testing::error_of([&] { train::training_device(fp64); }), "--moe-router-dtype fp64"));
}

}  // namespace
}  // namespace moecore
