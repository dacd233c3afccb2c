// Checkpoints under --bf16 keep their format: the saved weights are the optimizer's fp32 masters (not the model's
// bf16 values), so a resumed --bf16 run continues bitwise with the same masters and the model's weights their
// rounding, and an fp32 run loads a --bf16 checkpoint with the masters as its weights. The format is the one fp32
// runs write, so a --bf16 run loads theirs (and earlier builds') the same way.
#include <gtest/gtest.h>

#include <filesystem>

#include "config_util.h"
#include "moecore/ckpt/checkpoint.h"
#include "moecore/ckpt/manager.h"
#include "moecore/train/trainer.h"
#include "test_util.h"

namespace moecore {
namespace {

using testing::operator+;

std::vector<std::string> bf16_ckpt_args() {
  return testing::tiny_moe_flags() + std::vector<std::string>{"--bf16", "--lr-warmup-iters", "1"} +
         testing::mock_run_flags(16, 2, 4, 100, 6, "3e-3");
}

train::TrainConfig bf16_ckpt_config(const std::vector<std::string>& extra) {
  return testing::small_config(bf16_ckpt_args(), extra);
}

void expect_same_step(const train::StepResult& a, const train::StepResult& b, int step) {
  EXPECT_EQ(a.lm_loss, b.lm_loss) << "step " << step;
  EXPECT_EQ(a.grad_norm, b.grad_norm) << "step " << step;
}

TEST(Bf16Checkpoint, SavesMastersAndResumesBitwise) {
  testing::NullOut null;
  const std::string dir = testing::fresh_temp_path("bf16_ckpt");
  train::Trainer straight(bf16_ckpt_config({}), null.f, false);
  std::vector<train::StepResult> want;
  for (int i = 0; i < 6; i++) want.push_back(straight.train_step());
  std::vector<Tensor> masters;
  {
    train::Trainer first(bf16_ckpt_config({"--save", dir}), null.f, false);
    for (int i = 0; i < 3; i++) expect_same_step(first.train_step(), want[static_cast<size_t>(i)], i);
    first.save_checkpoint();
    first.optimizer().gather_master(masters);
    // The GEMM weights are bf16 in the model, the rest f32.
    const auto& all = first.params().all();
    int64_t b16 = 0;
    for (const auto& p : all) b16 += p->value.dtype() == DType::BF16 ? 1 : 0;
    EXPECT_GT(b16, 0);
    EXPECT_EQ(first.params().get("decoder.final_layernorm.weight").value.dtype(), DType::F32);
    // The saved weights are the fp32 masters, element for element.
    std::vector<Tensor> saved;
    std::vector<ckpt::LoadTarget> targets;
    saved.reserve(all.size());
    for (const auto& p : all) saved.push_back(Tensor::empty(p->value.shape(), DType::F32));
    for (size_t i = 0; i < all.size(); i++) targets.push_back({all[i]->name, ckpt::box_of(*all[i]), &saved[i], 0});
    ckpt::load_tensors(ckpt::iteration_dir(dir, 3), targets);
    bool some_not_bf16 = false;
    for (size_t i = 0; i < all.size(); i++) {
      ASSERT_TRUE(testing::bitwise_equal(saved[i], masters[i])) << all[i]->name;
      if (all[i]->value.dtype() == DType::BF16)
        some_not_bf16 |= !testing::bitwise_equal(saved[i].to(DType::BF16).to(DType::F32), saved[i]);
    }
    EXPECT_TRUE(some_not_bf16) << "the masters carry more than the bf16 values";
  }
  train::Trainer resumed(bf16_ckpt_config({"--load", dir}), null.f, false);
  EXPECT_EQ(resumed.iteration(), 3);
  {  // the optimizer's masters: the saved ones; the model's weights: those, rounded where stored in bf16
    std::vector<Tensor> loaded;
    resumed.optimizer().gather_master(loaded);
    const auto& ps = resumed.params().all();
    for (size_t i = 0; i < ps.size(); i++) {
      EXPECT_TRUE(testing::bitwise_equal(loaded[i], masters[i])) << ps[i]->name;
      EXPECT_TRUE(testing::bitwise_equal(ps[i]->value, masters[i].to(ps[i]->value.dtype()))) << ps[i]->name;
    }
  }
  for (int i = 3; i < 6; i++) expect_same_step(resumed.train_step(), want[static_cast<size_t>(i)], i);

  // An fp32 run takes the masters as its weights; a --bf16 run loads that fp32 run's checkpoint back.
  const std::vector<std::string> f32_args = {"--load", dir, "--finetune"};
  train::TrainConfig f32 =
      testing::small_config(testing::tiny_moe_flags() + testing::mock_run_flags(16, 2, 4, 100, 6, "3e-3"), f32_args);
  train::Trainer plain(f32, null.f, false);
  const auto& all = plain.params().all();
  for (size_t i = 0; i < all.size(); i++) {
    EXPECT_EQ(all[i]->value.dtype(), DType::F32);
    EXPECT_TRUE(testing::bitwise_equal(all[i]->value, masters[i])) << all[i]->name;
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace moecore
