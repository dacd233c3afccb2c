// Megatron FSDP's flags (train/config/flag_table_fsdp.cpp, config_validate_fsdp.cpp): Megatron's defaults, the
// distributed optimizer it implies, Megatron's validation rules with their messages, the dtypes moecore cannot do
// refused by name, the companions listed as without effect where Megatron does not read them, the GPU's refusal,
// and the rules of the Megatron FSDP flags outside the table.
#include <gtest/gtest.h>

#include "config_util.h"
#include "moecore/optim/chained_optimizer.h"
#include "moecore/train/config/device_support.h"
#include "moecore/train/config/optimizer_config.h"
#include "moecore/train/config/start_config.h"
#include "test_util.h"

namespace moecore {
namespace {

using testing::operator+;

std::vector<std::string> fsdp_flags_base() {
  return testing::tiny_moe_flags() + testing::mock_run_flags(16, 2, 2, 64, 1, "1e-3");
}
train::TrainConfig fsdp_config(const std::vector<std::string>& extra) {
  return testing::small_config(fsdp_flags_base(), extra);
}
std::string fsdp_error_of(const std::vector<std::string>& extra) {
  return testing::user_error_of([&] { fsdp_config(extra); });
}
bool fsdp_has_line(const std::vector<std::string>& lines, const std::string& start) {
  for (const auto& l : lines)
    if (l.rfind(start, 0) == 0) return true;
  return false;
}

TEST(FsdpFlags, MegatronsDefaultsAndTheDistributedOptimizerItImplies) {
  const train::TrainConfig plain = fsdp_config({});
  EXPECT_FALSE(plain.use_megatron_fsdp);
  EXPECT_EQ(plain.data_parallel_sharding_strategy, "optim_grads_params");
  EXPECT_EQ(plain.outer_dp_sharding_strategy, "no_shard");
  EXPECT_EQ(plain.megatron_fsdp_main_params_dtype, "fp32");
  EXPECT_EQ(plain.megatron_fsdp_main_grads_dtype, "auto");
  EXPECT_EQ(plain.megatron_fsdp_grad_comm_dtype, "auto");
  EXPECT_FALSE(plain.fsdp_double_buffer);
  EXPECT_FALSE(plain.init_model_with_meta_device);
  EXPECT_TRUE(plain.no_effect.empty());
  // Megatron FSDP v1 sets --use-distributed-optimizer; so does moecore, and the optimizer takes the strategy.
  const train::TrainConfig f = fsdp_config({"--use-megatron-fsdp"});
  EXPECT_TRUE(f.use_distributed_optimizer);
  EXPECT_TRUE(f.no_effect.empty());
  const optim::OptimizerConfig oc = train::optimizer_config(f);
  EXPECT_TRUE(oc.distributed);
  EXPECT_EQ(oc.sharding, optim::Sharding::OptimGradsParams);
  const std::vector<std::pair<std::string, optim::Sharding>> strategies{
      {"no_shard", optim::Sharding::NoShard},
      {"optim", optim::Sharding::Optim},
      {"optim_grads", optim::Sharding::OptimGrads},
      {"optim_grads_params", optim::Sharding::OptimGradsParams}};
  for (const auto& [name, sharding] : strategies)
    EXPECT_EQ(train::optimizer_config(fsdp_config({"--use-megatron-fsdp", "--data-parallel-sharding-strategy", name}))
                  .sharding,
              sharding)
        << name;
  // A Megatron FSDP launch line's companions: fsdp_dtensor, the overlaps, fp32 and auto dtypes, the double buffer.
  const train::TrainConfig line = fsdp_config(
      {"--use-megatron-fsdp", "--ckpt-format", "fsdp_dtensor", "--overlap-grad-reduce", "--overlap-param-gather",
       "--megatron-fsdp-main-params-dtype", "fp32", "--megatron-fsdp-main-grads-dtype", "fp32",
       "--megatron-fsdp-grad-comm-dtype", "auto", "--fsdp-double-buffer", "--init-model-with-meta-device"});
  EXPECT_TRUE(line.overlap_param_gather);
  ASSERT_EQ(line.no_effect.size(), 1u);  // the format selector only
  EXPECT_TRUE(fsdp_has_line(line.no_effect, "--ckpt-format fsdp_dtensor: "));
}

TEST(FsdpFlags, MegatronsRules) {
  EXPECT_EQ(fsdp_error_of({"--use-megatron-fsdp", "--optimizer", "muon"}),
            "Megatron-FSDP does not support the muon optimizer yet (Megatron's rule): use --optimizer adam or sgd");
  EXPECT_NE(fsdp_error_of({"--use-megatron-fsdp", "--check-weight-hash-across-dp-replicas-interval", "5"})
                .find("not supported with --data-parallel-sharding-strategy optim_grads_params"),
            std::string::npos);
  EXPECT_TRUE(fsdp_config({"--use-megatron-fsdp", "--data-parallel-sharding-strategy", "optim",
                           "--check-weight-hash-across-dp-replicas-interval", "5"})
                  .use_megatron_fsdp);
  EXPECT_EQ(fsdp_error_of({"--use-megatron-fsdp", "--ckpt-format", "torch_dist"})
                .rfind("Megatron-FSDP requires the `fsdp_dtensor` checkpointing format (Megatron's rule), not "
                       "--ckpt-format torch_dist",
                       0),
            0u);
  EXPECT_EQ(fsdp_error_of({"--ckpt-format", "fsdp_dtensor"})
                .rfind("--ckpt-format fsdp_dtensor is only tested with Megatron FSDP (Megatron's rule)", 0),
            0u);
  EXPECT_NE(fsdp_error_of({"--use-megatron-fsdp", "--data-parallel-sharding-strategy", "no_shard",
                           "--init-model-with-meta-device"})
                .find("is not supported or necessary for the 'no_shard' sharding strategy"),
            std::string::npos);
  EXPECT_NE(fsdp_error_of({"--use-megatron-fsdp", "--data-parallel-sharding-strategy", "optim_grads",
                           "--outer-dp-sharding-strategy", "optim", "--num-distributed-optimizer-instances", "2"})
                .find("--outer-dp-sharding-strategy optim requires --data-parallel-sharding-strategy "
                      "optim_grads_params"),
            std::string::npos);
  // The double buffer with full recompute of several layers per chunk: the replay releases each unit after its
  // forward, so two buffers suffice, as in Megatron.
  EXPECT_NO_THROW(
      fsdp_config({"--use-megatron-fsdp", "--fsdp-double-buffer", "--num-layers", "4", "--recompute-granularity",
                   "full", "--recompute-method", "uniform", "--recompute-num-layers", "2"}));
  // --overlap-param-gather: the distributed optimizer or Megatron FSDP; still with --overlap-grad-reduce.
  EXPECT_NE(fsdp_error_of({"--use-megatron-fsdp", "--overlap-param-gather"}).find("with --overlap-grad-reduce"),
            std::string::npos);
}

TEST(FsdpFlags, DtypesMoecoreCannotDoAreRefusedByName) {
  EXPECT_NE(fsdp_error_of({"--use-megatron-fsdp", "--megatron-fsdp-main-params-dtype", "bf16"})
                .find("--megatron-fsdp-main-params-dtype bf16: main (master) parameters in bf16 are not supported"),
            std::string::npos);
  EXPECT_NE(fsdp_error_of({"--use-megatron-fsdp", "--bf16", "--megatron-fsdp-main-params-dtype", "auto"})
                .find("--megatron-fsdp-main-params-dtype auto with --bf16: main (master) parameters in bf16"),
            std::string::npos);
  EXPECT_TRUE(fsdp_config({"--use-megatron-fsdp", "--megatron-fsdp-main-params-dtype", "auto"}).use_megatron_fsdp);
}

// The gradient dtypes take every value with Megatron's meaning: auto main gradients are the model's dtype, auto
// collectives the main gradients'.
TEST(FsdpFlags, GradientDtypesAsMegatron) {
  auto precision = [](const std::vector<std::string>& extra) {
    return train::grad_precision(fsdp_config(std::vector<std::string>{"--use-megatron-fsdp"} + extra));
  };
  EXPECT_EQ(precision({}).main, DType::F32);
  EXPECT_FALSE(precision({}).low());
  EXPECT_EQ(precision({"--bf16"}).main, DType::BF16);  // auto under --bf16, even with fp32 DDP buffers
  EXPECT_EQ(precision({"--bf16"}).comm, DType::BF16);
  EXPECT_EQ(precision({"--bf16", "--megatron-fsdp-main-grads-dtype", "fp32"}).comm, DType::F32);
  const optim::GradPrecision mixed =
      precision({"--bf16", "--megatron-fsdp-main-grads-dtype", "fp32", "--megatron-fsdp-grad-comm-dtype", "bf16"});
  EXPECT_EQ(mixed.main, DType::F32);
  EXPECT_EQ(mixed.comm, DType::BF16);
  EXPECT_EQ(precision({"--megatron-fsdp-grad-comm-dtype", "fp16"}).comm, DType::F16);
  EXPECT_EQ(precision({"--megatron-fsdp-main-grads-dtype", "bf16"}).comm, DType::BF16);
}

TEST(FsdpFlags, CompanionsWithoutFsdpHaveNoEffect) {
  const train::TrainConfig c = fsdp_config({"--data-parallel-sharding-strategy", "optim", "--fsdp-double-buffer",
                                            "--megatron-fsdp-grad-comm-dtype", "fp32"});
  ASSERT_EQ(c.no_effect.size(), 1u);
  EXPECT_TRUE(fsdp_has_line(c.no_effect,
                            "--data-parallel-sharding-strategy, --megatron-fsdp-grad-comm-dtype, --fsdp-double-buffer: "
                            "read only by Megatron FSDP"));
  // The outer strategy without HSDP, the ZeRO-3 buffer flags below optim_grads_params, the bucket size under FSDP.
  const train::TrainConfig d =
      fsdp_config({"--use-megatron-fsdp", "--data-parallel-sharding-strategy", "optim_grads",
                   "--outer-dp-sharding-strategy", "optim", "--fsdp-double-buffer", "--ddp-bucket-size", "1000"});
  ASSERT_EQ(d.no_effect.size(), 1u);
  EXPECT_TRUE(fsdp_has_line(d.no_effect, "--outer-dp-sharding-strategy, --fsdp-double-buffer, --ddp-bucket-size: "));
}

TEST(FsdpFlags, TheGpuRefusesFsdpByName) {
  EXPECT_EQ(train::gpu_training_gap(fsdp_config({"--use-megatron-fsdp"})),
            "--use-megatron-fsdp (Megatron FSDP) is not supported by moecore on the GPU yet");
}

TEST(FsdpFlags, TheRulesOfTheFlagsOutsideTheTable) {
  auto refusal = [](std::vector<std::string> extra) {
    return testing::user_error_of([&] { train::parse_flags(extra); });
  };
  EXPECT_NE(refusal({"--use-torch-fsdp2"}).find("use --use-megatron-fsdp"), std::string::npos);
  EXPECT_NE(refusal({"--megatron-fsdp-version", "2"}).find("Megatron FSDP version 2 is not supported"),
            std::string::npos);
  EXPECT_NE(refusal({"--megatron-fsdp-max-pool-double-buffer"}).find("use --fsdp-double-buffer"), std::string::npos);
  const train::TrainConfig c =
      fsdp_config({"--use-megatron-fsdp", "--megatron-fsdp-version", "1", "--suggested-communication-unit-size", "1000",
                   "--megatron-fsdp-enable-fine-grained-param-gather", "--enable-full-sharding-in-hsdp"});
  EXPECT_TRUE(fsdp_has_line(c.no_effect, "--megatron-fsdp-version 1: "));
  EXPECT_TRUE(fsdp_has_line(c.no_effect, "--suggested-communication-unit-size"));
  EXPECT_TRUE(fsdp_has_line(c.no_effect, "--enable-full-sharding-in-hsdp"));
}

}  // namespace
}  // namespace moecore
