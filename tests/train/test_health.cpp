// Numerical faults named (train/health): the first non-finite module of a diverging step, weights checked finite
// before they are saved, and the alarm for a run that stopped learning.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <limits>

#include "config_util.h"
#include "moecore/train/observe/health.h"
#include "moecore/train/trainer.h"
#include "test_util.h"

namespace moecore {
namespace {

using testing::error_of;
using testing::operator+;

train::TrainConfig tiny(const std::vector<std::string>& extra) {
  return testing::small_config(testing::tiny_moe_flags() + testing::mock_run_flags(16, 2, 2, 64, 3, "1e-3"), extra);
}

// Weights drawn with std 1e30 are finite, but the attention scores q·k overflow to inf and the softmax gives NaN:
// the re-run must name the attention of layer 0 in micro-batch 0, not a symptom further on.
TEST(Health, NamesTheFirstNonFiniteModuleOfADivergingStep) {
  std::FILE* null = std::fopen("/dev/null", "w");
  train::Trainer t(tiny({"--init-method-std", "1e30"}), null, false);
  const std::string e = error_of([&] { t.train_step(); });
  std::fclose(null);
  EXPECT_NE(e.find("is not finite"), std::string::npos) << e;
  EXPECT_NE(e.find("the forward output of decoder.layers.0.self_attention (micro-batch 0)"), std::string::npos) << e;
  EXPECT_NE(e.find("The step was not applied"), std::string::npos) << e;
}

TEST(Health, RefusesToSaveNonFiniteParametersNamingThem) {
  const std::string dir = testing::fresh_temp_path("health_save");
  std::FILE* null = std::fopen("/dev/null", "w");
  train::Trainer t(tiny({"--save", dir}), null, false);
  t.train_step();
  nn::Parameter& p = *t.params().all()[3];
  p.value.set_item(1, std::numeric_limits<double>::quiet_NaN());
  const std::string e = error_of([&] { t.save_checkpoint(); });
  std::fclose(null);
  EXPECT_NE(e.find("refusing to save iteration 1: parameter " + p.name), std::string::npos) << e;
  EXPECT_FALSE(std::filesystem::exists(dir + "/latest_checkpointed_iteration.txt"));
  std::filesystem::remove_all(dir);
}

TEST(Health, StallAlarmWarnsOnceForZeroGradientsOrUniformLogits) {
  train::StallAlarm a(64, 3);
  train::StepResult zero;
  zero.lm_loss = 3.0;
  EXPECT_FALSE(a.after_step(zero));
  EXPECT_FALSE(a.after_step(zero));
  const auto w = a.after_step(zero);
  ASSERT_TRUE(w);
  EXPECT_NE(w->find("exactly 0 for 3 steps"), std::string::npos) << *w;
  EXPECT_FALSE(a.after_step(zero));  // once per stall
  train::StepResult uniform;
  uniform.grad_norm = 0.5;
  uniform.lm_loss = std::log(64.0);
  EXPECT_FALSE(a.after_step(uniform));
  EXPECT_FALSE(a.after_step(uniform));
  const auto u = a.after_step(uniform);
  ASSERT_TRUE(u);
  EXPECT_NE(u->find("logits are uniform"), std::string::npos) << *u;
  train::StepResult learning;
  learning.grad_norm = 0.5;
  learning.lm_loss = 2.0;
  EXPECT_FALSE(a.after_step(learning));
}

}  // namespace
}  // namespace moecore
