// The optimizers beside Adam in whole training runs (one process): Muon, SGD and the decoupled embedding/output
// learning rate train and are refused where Megatron refuses them; Muon and SGD resume bitwise identically, and a
// checkpoint of one optimizer kind is refused by another unless --no-load-optim.
#include <gtest/gtest.h>

#include <cstdio>

#include "config_util.h"
#include "moecore/train/trainer.h"
#include "test_util.h"

namespace moecore {
namespace {

using testing::operator+;

std::vector<std::string> run_args() {
  return testing::tiny_moe_flags() + testing::mock_run_flags(16, 2, 4, 100, 6, "3e-3") +
         std::vector<std::string>{"--weight-decay", "0.1"};
}

train::TrainConfig optim_config(const std::vector<std::string>& extra) {
  return testing::small_config(run_args(), extra);
}

std::vector<train::StepResult> steps(const train::TrainConfig& c, int n) {
  testing::NullOut null;
  train::Trainer t(c, null.f, false);
  std::vector<train::StepResult> r;
  for (int i = 0; i < n; i++) r.push_back(t.train_step());
  return r;
}

TEST(OptimizerFlags, MegatronsChecks) {
  auto err = [](const std::vector<std::string>& extra) { return testing::user_error_of([&] { optim_config(extra); }); };
  EXPECT_NE(err({"--optimizer", "muon", "--muon-num-ns-steps", "4"}).find("multiple of 5"), std::string::npos);
  EXPECT_NE(err({"--optimizer", "lion"}).find("--optimizer"), std::string::npos);
  EXPECT_NE(err({"--optimizer", "muon", "--muon-scalar-optimizer", "lion"}).find("muon-scalar-optimizer"),
            std::string::npos);
  EXPECT_NE(err({"--sgd-momentum", "-0.5"}).find("sgd-momentum"), std::string::npos);
  EXPECT_NE(err({"--optimizer", "dist_muon", "--num-distributed-optimizer-instances", "2"}).find("layer-wise"),
            std::string::npos);
  EXPECT_NE(err({"--optimizer", "muon", "--use-distributed-optimizer", "--num-distributed-optimizer-instances", "2"})
                .find("layer-wise"),
            std::string::npos);
  EXPECT_NO_THROW(
      optim_config({"--optimizer", "muon", "--muon-coefficient-type", "polar_express", "--muon-num-ns-steps", "8"}));
  EXPECT_NO_THROW(optim_config({"--optimizer", "muon", "--num-distributed-optimizer-instances", "2"}));
}

TEST(OptimizerRuns, MuonAndSgdTrain) {
  for (const auto& opt : std::vector<std::vector<std::string>>{
           {"--optimizer", "muon"},
           {"--optimizer", "muon", "--muon-nesterov", "--muon-scale-mode", "unit_rms_norm"},
           {"--optimizer", "sgd", "--lr", "0.3"}}) {
    const auto r = steps(optim_config(opt), 6);
    EXPECT_LT(r.back().lm_loss, r.front().lm_loss) << opt[1];
  }
  // Muon is not Adam: the same run takes a different path.
  EXPECT_NE(steps(optim_config({"--optimizer", "muon"}), 2)[1].lm_loss, steps(optim_config({}), 2)[1].lm_loss);
}

TEST(OptimizerRuns, DecoupledLrMovesOnlyTheEmbeddingAndOutputRate) {
  const auto base = steps(optim_config({}), 3);
  const auto same = steps(optim_config({"--decoupled-lr", "3e-3"}), 3);  // = --lr: bitwise the same run
  for (int i = 0; i < 3; i++) EXPECT_EQ(same[static_cast<size_t>(i)].lm_loss, base[static_cast<size_t>(i)].lm_loss);
  const auto other = steps(optim_config({"--decoupled-lr", "0"}), 3);
  EXPECT_EQ(other[0].lm_loss, base[0].lm_loss);
  EXPECT_NE(other[2].lm_loss, base[2].lm_loss);
}

void expect_resumes_bitwise(const std::vector<std::string>& opt) {
  testing::NullOut null;
  const std::string dir = testing::fresh_temp_path("optim_resume");
  const auto want = steps(optim_config(opt), 6);
  {
    train::Trainer first(optim_config(opt + std::vector<std::string>{"--save", dir}), null.f, false);
    for (int i = 0; i < 3; i++) first.train_step();
    first.save_checkpoint();
  }
  train::Trainer resumed(optim_config(opt + std::vector<std::string>{"--save", dir, "--load", dir}), null.f, false);
  for (int i = 3; i < 6; i++) {
    const auto r = resumed.train_step();
    EXPECT_EQ(r.lm_loss, want[static_cast<size_t>(i)].lm_loss) << opt[1] << " step " << i;
    EXPECT_EQ(r.grad_norm, want[static_cast<size_t>(i)].grad_norm) << opt[1] << " step " << i;
  }
}

TEST(OptimizerRuns, MuonAndSgdResumeBitwise) {
  expect_resumes_bitwise({"--optimizer", "muon"});
  expect_resumes_bitwise({"--optimizer", "sgd"});
}

TEST(OptimizerRuns, AnotherOptimizersStateIsRefused) {
  testing::NullOut null;
  const std::string dir = testing::fresh_temp_path("optim_kind");
  {
    train::Trainer adam(optim_config({"--save", dir}), null.f, false);
    adam.train_step();
    adam.save_checkpoint();
  }
  const std::string e = testing::user_error_of([&] {
    train::Trainer muon(optim_config({"--optimizer", "muon", "--load", dir}), null.f, false);
  });
  EXPECT_NE(e.find("adam optimizer state"), std::string::npos) << e;
  EXPECT_NE(e.find("--no-load-optim"), std::string::npos) << e;
  train::Trainer ok(optim_config({"--optimizer", "muon", "--load", dir, "--no-load-optim"}), null.f, false);
  EXPECT_EQ(ok.iteration(), 1);
  ok.train_step();
}

}  // namespace
}  // namespace moecore
