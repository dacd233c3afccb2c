// FP8 training (--fp8-format, --fp8-recipe): Megatron's flags and their refusals, the GPU's refusal, and a tiny MoE
// model trained under each recipe against the same model in bf16: close losses, the same descent, bitwise reruns,
// and no FP8 GEMM at all when --first-last-layers-bf16 covers every layer.
#include <gtest/gtest.h>

#include <cstdio>

#include "config_util.h"
#include "moecore/train/config/device_support.h"
#include "moecore/train/trainer.h"
#include "test_util.h"

namespace moecore {
namespace {

using testing::operator+;
using Args = std::vector<std::string>;

Args fp8_run(int64_t iters) {
  return testing::tiny_moe_flags() + testing::mock_run_flags(16, 2, 4, 64, iters, "1e-2") +
         Args{"--bf16", "--device", "cpu"};
}

std::vector<double> fp8_losses(const Args& extra, int64_t iters) {
  const train::TrainConfig c = testing::small_config(fp8_run(iters), extra);
  std::FILE* null = std::fopen("/dev/null", "w");
  std::vector<double> losses;
  {
    train::Trainer t(c, null, false);
    for (int64_t s = 0; s < iters; s++) losses.push_back(t.train_step().lm_loss);
  }
  std::fclose(null);
  return losses;
}

TEST(Fp8Flags, MegatronDefaultsAndRefusals) {
  const train::TrainConfig d = testing::small_config(fp8_run(1), {"--fp8-format", "hybrid"});
  EXPECT_EQ(d.fp8_recipe, "delayed");
  EXPECT_EQ(d.fp8_margin, 0);
  EXPECT_EQ(d.fp8_amax_history_len, 1);
  EXPECT_EQ(d.fp8_amax_compute_algo, "most_recent");
  const nn::Fp8Config f = train::fp8_config(d);
  EXPECT_EQ(f.recipe, nn::Fp8Recipe::Delayed);
  EXPECT_TRUE(f.hybrid);
  EXPECT_EQ(f.bf16_start + f.bf16_end, 0);
  const nn::Fp8Config fl =
      train::fp8_config(testing::small_config(fp8_run(1), {"--fp8-format", "e4m3", "--first-last-layers-bf16"}));
  EXPECT_EQ(fl.bf16_start, 1);  // Megatron's default counts
  EXPECT_EQ(fl.bf16_end, 1);
  EXPECT_FALSE(fl.hybrid);
  auto error = [](const Args& extra) {
    return testing::user_error_of([&] { testing::small_config(fp8_run(1), extra); });
  };
  EXPECT_NE(error({"--fp8-format", "e4m3", "--fp8-recipe", "mxfp8"}).find("Blackwell-only"), std::string::npos);
  EXPECT_NE(error({"--fp4-format", "e2m1"}).find("Blackwell-only"), std::string::npos);
  EXPECT_NE(error({"--fp8-format", "e4m3", "--fp8-recipe", "custom"}).find("--fp8-quantizer-factory"),
            std::string::npos);
  // --fp8-param-gather as Megatron: only with the distributed optimizer or Megatron FSDP, and only with FP8.
  EXPECT_NE(error({"--fp8-format", "e4m3", "--fp8-param-gather"}).find("add --use-distributed-optimizer"),
            std::string::npos);
  EXPECT_NE(error({"--use-distributed-optimizer", "--fp8-param-gather"}).find("add --fp8-format"), std::string::npos);
  const train::TrainConfig pg =
      testing::small_config(fp8_run(1), {"--fp8-format", "e4m3", "--fp8-param-gather", "--use-distributed-optimizer"});
  EXPECT_TRUE(train::fp8_config(pg).param_gather);
  EXPECT_NE(train::gpu_training_gap(pg).find("--fp8-param-gather"), std::string::npos);
  EXPECT_NE(error({"--fp8-format", "e5m2"}).find("--fp8-format"), std::string::npos);
  // Recipe flags without --fp8-format are read by nobody: listed as having no effect.
  const train::TrainConfig ne = testing::small_config(fp8_run(1), {"--fp8-recipe", "blockwise"});
  ASSERT_EQ(ne.no_effect.size(), 1u);
  EXPECT_NE(ne.no_effect[0].find("read only with --fp8-format"), std::string::npos);
  EXPECT_TRUE(train::fp8_config(ne).recipe == nn::Fp8Recipe::Off);
  // The GPU refuses FP8 by name before any work.
  EXPECT_NE(train::gpu_training_gap(d).find("FP8 training is CPU-only in moecore"), std::string::npos);
  EXPECT_EQ(train::gpu_training_gap(ne), "");
}

// Each recipe against bf16: the last loss within 3 %, every step's within 5 %, and the loss falls as bf16's does.
TEST(Fp8Train, RecipesFollowBf16) {
  const int64_t iters = 12;
  const std::vector<double> ref = fp8_losses({}, iters);
  ASSERT_LT(ref.back(), ref.front() - 0.3);
  for (const Args& recipe :
       {Args{"--fp8-recipe", "delayed", "--fp8-amax-history-len", "4", "--fp8-amax-compute-algo", "max"},
        Args{"--fp8-recipe", "tensorwise"}, Args{"--fp8-recipe", "blockwise"}}) {
    const std::vector<double> l = fp8_losses(Args{"--fp8-format", "hybrid"} + recipe, iters);
    for (int64_t s = 0; s < iters; s++) EXPECT_NEAR(l[s], ref[s], 0.05 * ref[s]) << recipe[1] << " step " << s;
    EXPECT_NEAR(l.back(), ref.back(), 0.03 * ref.back()) << recipe[1];
    EXPECT_NE(l, ref) << recipe[1] << ": the FP8 GEMMs changed nothing";
  }
}

TEST(Fp8Train, BitwiseRerunsAndBf16FirstLastLayers) {
  const Args fp8{"--fp8-format", "e4m3", "--fp8-recipe", "tensorwise"};
  EXPECT_EQ(fp8_losses(fp8, 3), fp8_losses(fp8, 3));
  // Two layers, both kept in bf16: the run is the bf16 run, bit for bit.
  EXPECT_EQ(fp8_losses(fp8 + Args{"--first-last-layers-bf16"}, 3), fp8_losses({}, 3));
}

}  // namespace
}  // namespace moecore
