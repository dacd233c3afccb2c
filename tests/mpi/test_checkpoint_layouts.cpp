// Checkpoints across layouts over MPI ranks: a model saved under one layout (TP2 with the distributed optimizer
// on 2 ranks; TP2×EP2 with DP2 on 4) loads under another (EP2; TP1×EP4 with DP4) and on one rank with the same
// logits, training continues with the same losses (Adam moments resharded over DP), and the second layout's
// checkpoint (EP2; EP4) loads on one rank with its logits. In one layout, K steps +
// save + load + N−K steps equal N straight steps bitwise. Expert biases reshard from EP to one rank.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "config_util.h"
#include "layout_util.h"
#include "moecore/core/rng.h"
#include "moecore/kernels/elementwise.h"
#include "moecore/train/trainer.h"

namespace moecore {
namespace {

namespace fs = std::filesystem;
using testing::operator+;

std::vector<std::string> ckpt_layout_model_args() {
  return testing::layered_moe_flags() +
         std::vector<std::string>{"--moe-router-score-function", "sigmoid", "--moe-router-enable-expert-bias"} +
         testing::mock_run_flags(32, 2, 8, 100, 6, "1e-3");
}

train::TrainConfig ckpt_layout_config(const std::vector<std::string>& layout, const std::vector<std::string>& extra) {
  return testing::small_config(train::override_flags(ckpt_layout_model_args(), layout), extra);
}

const std::vector<std::string> kCheckpointLayoutsTP2{"--tensor-model-parallel-size", "2", "--sequence-parallel"};

// The first `vocab` logits of every position of a fixed sequence.
std::vector<float> logits_of(train::Trainer& t, int64_t vocab) {
  Tensor tok = Tensor::empty({1, 32}, DType::I64);
  const Philox rng(3, 9);
  for (int64_t i = 0; i < 32; i++)
    tok.data<int64_t>()[i] = static_cast<int64_t>(rng.block(static_cast<uint64_t>(i))[0] % 100);
  const Tensor l = t.model().logits(tok);
  std::vector<float> out;
  for (int64_t s = 0; s < 32; s++)
    for (int64_t v = 0; v < vocab; v++) out.push_back(l.data<float>()[s * l.dim(1) + v]);
  return out;
}

void expect_close(const std::vector<float>& a, const std::vector<float>& b, const char* what) {
  ASSERT_EQ(a.size(), b.size());
  double mx = 0, diff = 0;
  for (size_t i = 0; i < a.size(); i++) {
    mx = std::max(mx, std::fabs(static_cast<double>(b[i])));
    diff = std::max(diff, std::fabs(static_cast<double>(a[i]) - b[i]));
  }
  EXPECT_LE(diff, 1e-5 * mx) << what;
}

TEST(CheckpointLayouts, ReshardedModelGivesTheSameLogitsAndTraining) {
  const comm::ProcessGroup w = comm::ProcessGroup::world();
  if (w.size() != 2 && w.size() != 4) GTEST_SKIP() << "runs on 2 or 4 ranks";
  std::vector<std::string> save_layout = kCheckpointLayoutsTP2, load_layout = {"--expert-model-parallel-size", "2"};
  save_layout.insert(save_layout.end(), {"--expert-tensor-parallel-size", "1", "--use-distributed-optimizer"});
  if (w.size() == 4) {
    save_layout.insert(save_layout.end(), {"--expert-model-parallel-size", "2"});        // TP2 x EP2, DP2
    load_layout = {"--expert-model-parallel-size", "4", "--use-distributed-optimizer"};  // TP1 x EP4, DP4
  }
  const std::string dir = testing::mpi_shared_dir(w, "reshard");
  std::FILE* null = std::fopen("/dev/null", "w");
  std::vector<float> saved_logits;
  {
    train::Trainer a(ckpt_layout_config(save_layout, {"--save", dir}), null, false, &w);
    for (int i = 0; i < 3; i++) a.train_step();
    a.save_checkpoint();
    saved_logits = logits_of(a, 100);
  }
  const std::string dir2 = testing::mpi_shared_dir(w, "reshard_again");
  train::Trainer b(ckpt_layout_config(load_layout, {"--load", dir, "--save", dir2}), null, false, &w);
  train::Trainer one(ckpt_layout_config({}, {"--load", dir}), null, false, nullptr);  // every rank: the whole model
  EXPECT_EQ(b.iteration(), 3);
  EXPECT_EQ(one.iteration(), 3);
  const auto want = logits_of(one, 100);
  expect_close(saved_logits, want, "saved layout vs one rank");
  expect_close(logits_of(b, 100), want, "loaded layout vs one rank");
  for (int i = 0; i < 3; i++) {
    const auto rb = b.train_step(), r1 = one.train_step();
    EXPECT_NEAR(rb.lm_loss, r1.lm_loss, 1e-5 * r1.lm_loss) << "step " << i;
    EXPECT_NEAR(rb.grad_norm, r1.grad_norm, 1e-5 * r1.grad_norm) << "step " << i;
  }
  // And back: the second layout's checkpoint (EP2 or EP4) on one rank.
  b.save_checkpoint();
  train::Trainer again(ckpt_layout_config({}, {"--load", dir2}), null, false, nullptr);
  EXPECT_EQ(again.iteration(), 6);
  expect_close(logits_of(again, 100), logits_of(b, 100), "second layout vs one rank");
  std::fclose(null);
  w.barrier();
  if (w.rank() == 0) {
    fs::remove_all(dir);
    fs::remove_all(dir2);
  }
}

TEST(CheckpointLayouts, ResumeIsBitwiseInOneLayout) {
  const comm::ProcessGroup w = comm::ProcessGroup::world();
  if (w.size() != 2 && w.size() != 4) GTEST_SKIP() << "runs on 2 or 4 ranks";
  std::vector<std::string> layout = {"--expert-model-parallel-size", "2", "--use-distributed-optimizer"};
  if (w.size() == 4) layout.insert(layout.end(), kCheckpointLayoutsTP2.begin(), kCheckpointLayoutsTP2.end());
  const std::string dir = testing::mpi_shared_dir(w, "resume");
  testing::expect_bitwise_resume(
      [&](const std::vector<std::string>& extra) { return ckpt_layout_config(layout, extra); }, dir, w);
  w.barrier();
  if (w.rank() == 0) fs::remove_all(dir);
}

// Megatron's default linear biases (router gating bias, expert fc1 and fc2 biases sharded over EP with the experts):
// saved under EP over every rank with the distributed optimizer, loaded on one rank with the same logits and the
// same training.
TEST(CheckpointLayouts, ExpertBiasesReshardFromEpToOneRank) {
  const comm::ProcessGroup w = comm::ProcessGroup::world();
  if (w.size() != 2 && w.size() != 4) GTEST_SKIP() << "runs on 2 or 4 ranks";
  std::vector<std::string> model = testing::tiny_moe_flags();
  model.erase(std::find(model.begin(), model.end(), "--disable-bias-linear"));
  auto config = [&](const std::vector<std::string>& extra) {
    return testing::small_config(model + testing::mock_run_flags(32, 2, 8, 100, 6, "3e-3"), extra);
  };
  const std::string dir = testing::mpi_shared_dir(w, "bias_reshard");
  std::FILE* null = std::fopen("/dev/null", "w");
  std::vector<float> saved_logits;
  {
    train::Trainer a(config({"--save", dir, "--expert-model-parallel-size", std::to_string(w.size()),
                             "--use-distributed-optimizer"}),
                     null, false, &w);
    for (int i = 0; i < 3; i++) a.train_step();
    a.save_checkpoint();
    saved_logits = logits_of(a, 100);
  }
  train::Trainer one(config({"--load", dir}), null, false, nullptr);
  EXPECT_EQ(one.iteration(), 3);
  EXPECT_GT(kernels::sum_squares(one.params().get("decoder.layers.0.mlp.experts.linear_fc2.bias").value), 0.0);
  expect_close(saved_logits, logits_of(one, 100), "EP layout vs one rank");
  std::fclose(null);
  w.barrier();
  if (w.rank() == 0) fs::remove_all(dir);
}

}  // namespace
}  // namespace moecore
