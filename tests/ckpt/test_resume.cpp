// Training checkpoints in one process: K steps + save + load + N−K steps equal N straight steps bitwise (model,
// Adam moments, iteration, data position, expert bias, router noise counters); the optimizer state matters and
// --no-load-optim drops it; --finetune keeps only the weights; a different model or schedule is refused naming the
// flags; a broken marker is named; --load of an empty directory starts afresh.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "config_util.h"
#include "moecore/ckpt/manager.h"
#include "moecore/train/trainer.h"
#include "test_util.h"

namespace moecore {
namespace {

namespace fs = std::filesystem;
using testing::error_of;
using testing::operator+;

std::string resume_dir(const std::string& name) {
  return testing::fresh_temp_path("resume_" + name);
}

// Sigmoid routing with expert bias and input jitter: every kind of state a step carries into the next.
std::vector<std::string> resume_model_args() {
  return testing::tiny_moe_flags() +
         std::vector<std::string>{"--group-query-attention",
                                  "--num-query-groups",
                                  "2",
                                  "--moe-router-score-function",
                                  "sigmoid",
                                  "--moe-router-enable-expert-bias",
                                  "--moe-input-jitter-eps",
                                  "0.01",
                                  "--moe-aux-loss-coeff",
                                  "1e-2",
                                  "--moe-z-loss-coeff",
                                  "1e-3",
                                  "--lr-warmup-iters",
                                  "2",
                                  "--lr-decay-style",
                                  "cosine",
                                  "--log-interval",
                                  "4"} +
         testing::mock_run_flags(16, 2, 4, 100, 6, "3e-3");
}

train::TrainConfig resume_config(const std::vector<std::string>& extra) {
  return testing::small_config(resume_model_args(), extra);
}

void expect_resume_bitwise(const train::StepResult& a, const train::StepResult& b, int step) {
  EXPECT_EQ(a.lm_loss, b.lm_loss) << "step " << step;
  EXPECT_EQ(a.grad_norm, b.grad_norm) << "step " << step;
  EXPECT_EQ(a.z_loss, b.z_loss) << "step " << step;
  EXPECT_EQ(a.aux_losses, b.aux_losses) << "step " << step;
}

TEST(Resume, ContinuesBitwiseIdentically) {
  testing::NullOut null;
  const std::string dir = resume_dir("exact");
  train::Trainer straight(resume_config({}), null.f, false);
  std::vector<train::StepResult> want;
  for (int i = 0; i < 6; i++) want.push_back(straight.train_step());
  {
    train::Trainer first(resume_config({"--save", dir}), null.f, false);
    for (int i = 0; i < 3; i++) expect_resume_bitwise(first.train_step(), want[static_cast<size_t>(i)], i);
    first.save_checkpoint();
  }
  train::Trainer resumed(resume_config({"--save", dir, "--load", dir}), null.f, false);
  EXPECT_EQ(resumed.iteration(), 3);
  EXPECT_EQ(resumed.loaded_from(), ckpt::iteration_dir(dir, 3));
  // --finetune restarts at iteration 0 from the same weights.
  train::Trainer finetune(resume_config({"--load", dir, "--finetune"}), null.f, false);
  EXPECT_EQ(finetune.iteration(), 0);
  for (const auto& p : resumed.params().all()) {
    const Tensor& f = finetune.params().get(p->name).value;
    for (int64_t i = 0; i < f.numel(); i++) ASSERT_EQ(f.item(i), p->value.item(i)) << p->name;
  }
  for (int i = 3; i < 6; i++) expect_resume_bitwise(resumed.train_step(), want[static_cast<size_t>(i)], i);
  // The expert bias moved during training and came back with the checkpoint.
  auto* l = resumed.moe_layers()[0];
  auto* s = straight.moe_layers()[0];
  for (int64_t e = 0; e < 4; e++) EXPECT_EQ(l->router().expert_bias().item(e), s->router().expert_bias().item(e));
  EXPECT_NE(s->router().expert_bias().item(0), 0.0);

  // Without the Adam moments the first step matches (same weights and data) and the next differs.
  train::Trainer no_optim(resume_config({"--load", dir, "--no-load-optim"}), null.f, false);
  EXPECT_EQ(no_optim.iteration(), 3);
  EXPECT_EQ(no_optim.train_step().lm_loss, want[3].lm_loss);
  EXPECT_NE(no_optim.train_step().lm_loss, want[4].lm_loss);
  fs::remove_all(dir);
}

TEST(Resume, RefusesAnotherModelOrScheduleNamingTheFlags) {
  testing::NullOut null;
  const std::string dir = resume_dir("refuse");
  {
    train::Trainer t(resume_config({"--save", dir}), null.f, false);
    t.train_step();
    t.save_checkpoint();
  }
  std::string e = error_of([&] {
    train::Trainer(resume_config({"--load", dir, "--moe-router-topk", "1"}), null.f, false);
  });
  EXPECT_NE(e.find("--moe-router-topk: 2 in the checkpoint, 1 here"), std::string::npos) << e;
  e = error_of([&] { train::Trainer(resume_config({"--load", dir, "--lr", "1e-3"}), null.f, false); });
  EXPECT_NE(e.find("different learning-rate schedule"), std::string::npos) << e;
  EXPECT_NE(e.find("--lr: 0.003 in the checkpoint, 0.001 here"), std::string::npos) << e;
  // A different width cannot load even with --finetune: the shapes are named.
  e = error_of([&] {
    train::Trainer(resume_config({"--load", dir, "--finetune", "--moe-ffn-hidden-size", "16"}), null.f, false);
  });
  EXPECT_NE(e.find("experts.linear_fc2.weight: the checkpoint's global shape [4, 32, 32] differs from the "
                   "model's [4, 32, 16]"),
            std::string::npos)
      << e;
  // A broken marker is named with what it holds.
  std::ofstream(dir + "/" + ckpt::kLatestFile) << "twelve";
  e = error_of([&] { train::Trainer(resume_config({"--load", dir}), null.f, false); });
  EXPECT_NE(e.find("latest_checkpointed_iteration.txt is corrupt"), std::string::npos) << e;
  std::ofstream(dir + "/" + ckpt::kLatestFile) << "7";
  e = error_of([&] { train::Trainer(resume_config({"--load", dir}), null.f, false); });
  EXPECT_NE(e.find("iter_0000007, which is missing or incomplete"), std::string::npos) << e;
  // An empty --load directory: a fresh start.
  const std::string empty = resume_dir("empty");
  fs::create_directories(empty);
  train::Trainer fresh(resume_config({"--load", empty}), null.f, false);
  EXPECT_EQ(fresh.iteration(), 0);
  EXPECT_EQ(fresh.loaded_from(), "");
  fs::remove_all(dir);
  fs::remove_all(empty);
}

}  // namespace
}  // namespace moecore
