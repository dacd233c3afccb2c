// Megatron's precision-aware optimizer flags (--use-precision-aware-optimizer --exp-avg-dtype / --exp-avg-sq-dtype):
// Megatron's checks refused before any work, the moments stored in bf16 where asked, and the memory plan counting 2
// bytes for each. The update's numerics: tests/kernels/test_adamw.cpp; layouts and a bitwise resume:
// tests/mpi/test_optimizer_layouts.cpp.
#include <gtest/gtest.h>

#include "config_util.h"
#include "moecore/train/config/optimizer_config.h"
#include "moecore/train/memory_plan.h"
#include "moecore/train/trainer.h"
#include "test_util.h"

namespace moecore {
namespace {

using testing::operator+;

std::vector<std::string> run_flags() {
  return testing::tiny_moe_flags() + testing::mock_run_flags(32, 2, 4, 128, 3, "1e-3");
}

TEST(PrecisionAwareOptimizer, MegatronsChecks) {
  auto error = [](const std::vector<std::string>& extra) {
    return testing::user_error_of([&] { testing::small_config(run_flags(), extra); });
  };
  EXPECT_NE(error({"--exp-avg-dtype", "bf16"})
                .find("exp-avg-dtype can only be fp32 when not using precision-aware optimizer"),
            std::string::npos);
  EXPECT_NE(error({"--use-precision-aware-optimizer", "--exp-avg-sq-dtype", "bf16"})
                .find("only supported with distributed optimizer"),
            std::string::npos);
  EXPECT_NE(error({"--use-precision-aware-optimizer", "--use-distributed-optimizer", "--optimizer", "sgd"})
                .find("only supported with adam"),
            std::string::npos);
  EXPECT_NE(error({"--use-precision-aware-optimizer", "--use-distributed-optimizer", "--exp-avg-dtype", "fp16"})
                .find("Adam moments in fp16 (scaled states) are not supported"),
            std::string::npos);
  // fp32 moments with the flag: the same AdamW.
  const train::TrainConfig same =
      testing::small_config(run_flags(), {"--use-precision-aware-optimizer", "--use-distributed-optimizer"});
  EXPECT_FALSE(train::optimizer_config(same).rule.bf16_exp_avg);
}

TEST(PrecisionAwareOptimizer, Bf16MomentsAreStoredAndPlannedAsTwoBytes) {
  const std::vector<std::string> bf16{"--use-precision-aware-optimizer",
                                      "--use-distributed-optimizer",
                                      "--exp-avg-dtype",
                                      "bf16",
                                      "--exp-avg-sq-dtype",
                                      "bf16"};
  const train::TrainConfig f32 = testing::small_config(run_flags(), {"--use-distributed-optimizer"}),
                           low = testing::small_config(run_flags(), bf16);
  std::FILE* null = std::fopen("/dev/null", "w");
  train::Trainer t(low, null, false);
  t.train_step();
  std::vector<Tensor> m, v;
  t.optimizer().gather_moments(m, v);
  ASSERT_FALSE(m.empty());
  for (size_t i = 0; i < m.size(); i++) {
    EXPECT_EQ(m[i].dtype(), DType::BF16) << i;
    EXPECT_EQ(v[i].dtype(), DType::BF16) << i;
  }
  std::fclose(null);
  const train::PlanLayout one;
  EXPECT_DOUBLE_EQ(train::plan_memory(low, 128, one, 0).adam * 2, train::plan_memory(f32, 128, one, 0).adam);
}

}  // namespace
}  // namespace moecore
