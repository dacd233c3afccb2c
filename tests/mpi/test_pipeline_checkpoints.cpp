// Checkpoints under pipeline parallelism: each stage writes its layers (the tied word embedding once, every
// router's state), the layout-free index loads into another layout (PP2 → one rank; on 4 ranks PP2×EP2 → TP2×EP2,
// on 8 ranks PP2×EP2 → TP2×EP4; a one-rank checkpoint into PP4 with two virtual stages per rank) and training
// continues with the same losses; K steps + save + load + N−K steps under PP2 equal N straight
// steps bitwise.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>

#include "config_util.h"
#include "layout_util.h"
#include "moecore/train/trainer.h"

namespace moecore {
namespace {

namespace fs = std::filesystem;
using testing::operator+;

std::vector<std::string> pp_ckpt_model_args() {
  return train::override_flags(testing::tiny_moe_flags(), {"--num-layers", "4"}) +
         std::vector<std::string>{"--moe-layer-freq",
                                  "[0,1,1,1]",
                                  "--ffn-hidden-size",
                                  "48",
                                  "--moe-router-score-function",
                                  "sigmoid",
                                  "--moe-router-enable-expert-bias",
                                  "--moe-aux-loss-coeff",
                                  "1e-2",
                                  "--make-vocab-size-divisible-by",
                                  "64"} +
         testing::mock_run_flags(16, 2, 8, 128, 6, "1e-3");
}

train::TrainConfig pp_ckpt_config(const std::vector<std::string>& layout, const std::vector<std::string>& extra) {
  return testing::small_config(pp_ckpt_model_args() + layout, extra);
}

const std::vector<std::string> kPipelineCheckpointsPP2{"--pipeline-model-parallel-size", "2"};

TEST(PipelineCheckpoints, SavedUnderPipelineLoadsInAnotherLayout) {
  const comm::ProcessGroup w = comm::ProcessGroup::world();
  if (w.size() != 2 && w.size() != 4 && w.size() != 8) GTEST_SKIP() << "runs on 2, 4 or 8 ranks";
  std::vector<std::string> save_layout = kPipelineCheckpointsPP2, load_layout = {};
  if (w.size() >= 4) {
    save_layout = kPipelineCheckpointsPP2 + std::vector<std::string>{"--expert-model-parallel-size", "2"};
    load_layout = {"--tensor-model-parallel-size", "2", "--sequence-parallel", "--expert-model-parallel-size",
                   w.size() == 8 ? "4" : "2"};
  }
  const std::string dir = testing::mpi_shared_dir(w, "pp_reshard");
  std::FILE* null = std::fopen("/dev/null", "w");
  std::vector<train::StepResult> want;
  {
    train::Trainer a(pp_ckpt_config(save_layout, {"--save", dir}), null, false, &w);
    for (int i = 0; i < 3; i++) a.train_step();
    a.save_checkpoint();
    for (int i = 0; i < 3; i++) want.push_back(a.train_step());
  }
  train::Trainer one(pp_ckpt_config({}, {"--load", dir}), null, false, nullptr);  // every rank: the whole model
  EXPECT_EQ(one.iteration(), 3);
  std::unique_ptr<train::Trainer> other;
  if (!load_layout.empty())
    other = std::make_unique<train::Trainer>(pp_ckpt_config(load_layout, {"--load", dir}), null, false, &w);
  for (int i = 0; i < 3; i++) {
    const auto r1 = one.train_step();
    EXPECT_NEAR(r1.lm_loss, want[i].lm_loss, 1e-5 * want[i].lm_loss) << "step " << i;
    EXPECT_NEAR(r1.grad_norm, want[i].grad_norm, 1e-5 * want[i].grad_norm) << "step " << i;
    if (other) {
      const auto r2 = other->train_step();
      EXPECT_NEAR(r2.lm_loss, want[i].lm_loss, 1e-5 * want[i].lm_loss) << "step " << i;
      EXPECT_NEAR(r2.grad_norm, want[i].grad_norm, 1e-5 * want[i].grad_norm) << "step " << i;
    }
  }
  other.reset();
  std::fclose(null);
  w.barrier();
  if (w.rank() == 0) fs::remove_all(dir);
}

// A checkpoint written by one rank (no pipeline) loads into PP4 with two virtual stages per rank (8 layers: one
// per model chunk) and continues with the one-rank run's losses.
TEST(PipelineCheckpoints, OneRankCheckpointLoadsIntoVirtualStages) {
  const comm::ProcessGroup w = comm::ProcessGroup::world();
  if (w.size() != 4) GTEST_SKIP() << "runs on 4 ranks";
  const std::vector<std::string> eight = {"--num-layers", "8", "--moe-layer-freq", "[0,1,1,1,1,1,1,0]"};
  auto config = [&](const std::vector<std::string>& layout, const std::vector<std::string>& extra) {
    return testing::small_config(train::override_flags(pp_ckpt_model_args(), eight) + layout, extra);
  };
  const std::string dir = testing::mpi_shared_dir(w, "pp_vpp");
  std::FILE* null = std::fopen("/dev/null", "w");
  Tensor want = Tensor::zeros({3, 2}, DType::F64);  // rank 0's losses and grad norms after the save
  if (w.rank() == 0) {
    train::Trainer one(config({}, {"--save", dir}), null, false, nullptr);
    for (int i = 0; i < 3; i++) one.train_step();
    one.save_checkpoint();
    for (int i = 0; i < 3; i++) {
      const auto r = one.train_step();
      want.set_item(2 * i, r.lm_loss), want.set_item(2 * i + 1, r.grad_norm);
    }
  }
  w.broadcast(want, 0);
  {
    train::Trainer vpp(
        config({"--pipeline-model-parallel-size", "4", "--num-virtual-stages-per-pipeline-rank", "2"}, {"--load", dir}),
        null, false, &w);
    EXPECT_EQ(vpp.iteration(), 3);
    for (int i = 0; i < 3; i++) {
      const auto r = vpp.train_step();
      EXPECT_NEAR(r.lm_loss, want.item(2 * i), 1e-5 * want.item(2 * i)) << "step " << i;
      EXPECT_NEAR(r.grad_norm, want.item(2 * i + 1), 1e-5 * want.item(2 * i + 1)) << "step " << i;
    }
  }
  std::fclose(null);
  w.barrier();
  if (w.rank() == 0) fs::remove_all(dir);
}

TEST(PipelineCheckpoints, ResumeIsBitwiseUnderPipeline) {
  const comm::ProcessGroup w = comm::ProcessGroup::world();
  if (w.size() != 2 && w.size() != 4) GTEST_SKIP() << "runs on 2 or 4 ranks";
  std::vector<std::string> layout = kPipelineCheckpointsPP2;
  if (w.size() == 4)
    layout = layout + std::vector<std::string>{"--expert-model-parallel-size", "2", "--use-distributed-optimizer"};
  const std::string dir = testing::mpi_shared_dir(w, "pp_resume");
  testing::expect_bitwise_resume([&](const std::vector<std::string>& extra) { return pp_ckpt_config(layout, extra); },
                                 dir, w);
  w.barrier();
  if (w.rank() == 0) fs::remove_all(dir);
}

}  // namespace
}  // namespace moecore
