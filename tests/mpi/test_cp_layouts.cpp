// Layout invariance of context parallelism: a tiny MoE job under CP2, CP4, CP2×TP2×SP, CP2×EP2, CP2×PP2, MTP under
// CP2, CP4 and CP2×TP2,
// CP2×DP2 with the distributed optimizer and CP2×TP2×DP2×EP4 (8 ranks) gives the single-rank run's per-step lm loss,
// grad norm, aux and z losses within 1e-5 relative; every --cp-comm-type at least once; dropout, learned positions
// and per-token loss under CP; checkpoints saved under CP2 load under CP1 and CP4; reruns are bitwise identical.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "config_util.h"
#include "layout_util.h"
#include "moecore/comm/process_group.h"
#include "moecore/train/trainer.h"

namespace moecore {
namespace {

namespace fs = std::filesystem;
using testing::operator+;

struct CpLayout {
  std::string name;
  int64_t world;
  std::vector<std::string> flags;   // the model and run (both runs)
  std::vector<std::string> layout;  // the parallel layout (the multi-rank run)
};

// Three layers (dense first), GQA with qk-norm, shared expert, aux + seq_aux + z losses; sequences of 32.
std::vector<std::string> base_flags() {
  return train::override_flags(testing::layered_moe_flags(), {"--moe-router-load-balancing-type", "aux_loss",
                                                              "seq_aux_loss", "--moe-aux-loss-coeff", "1e-2", "1e-3"}) +
         testing::mock_run_flags(32, 2, 8, 120, 3, "1e-3") +
         std::vector<std::string>{"--make-vocab-size-divisible-by", "64"};
}

class CpLayouts : public ::testing::TestWithParam<CpLayout> {};

TEST_P(CpLayouts, MatchSingleRank) {
  const comm::ProcessGroup w = comm::ProcessGroup::world();
  const CpLayout& l = GetParam();
  if (w.size() != l.world) GTEST_SKIP() << l.name << " runs on " << l.world << " ranks";
  const std::vector<std::string> args = train::override_flags(base_flags(), l.flags);
  testing::expect_same_steps(testing::small_config(args), testing::small_config(args + l.layout), w, 3);
}

std::vector<std::string> cp(int64_t c, const std::string& type = "p2p") {
  return {"--context-parallel-size", std::to_string(c), "--cp-comm-type", type};
}
const std::vector<std::string> kTP2{"--tensor-model-parallel-size", "2", "--sequence-parallel",
                                    "--expert-tensor-parallel-size", "1"};

INSTANTIATE_TEST_SUITE_P(
    CP, CpLayouts,
    ::testing::Values(
        CpLayout{"CP2", 2, {}, cp(2)}, CpLayout{"CP2_a2a", 2, {}, cp(2, "a2a")},
        CpLayout{"CP2_dropout", 2, {"--hidden-dropout", "0.1", "--attention-dropout", "0.1"}, cp(2, "allgather")},
        CpLayout{"CP2_MegatronDefaults",
                 2,
                 {"--normalization", "LayerNorm", "--position-embedding-type", "learned_absolute"},
                 cp(2)},
        CpLayout{"CP2_PerTokenLoss", 2, {"--calculate-per-token-loss"}, cp(2)},
        CpLayout{"CP2_EP2", 2, {}, cp(2) + std::vector<std::string>{"--expert-model-parallel-size", "2"}},
        CpLayout{"CP2_MTP", 2, {"--mtp-num-layers", "2"}, cp(2)},
        CpLayout{
            "CP2_MTP_PerTokenLoss", 2, {"--mtp-num-layers", "1", "--calculate-per-token-loss"}, cp(2, "allgather")},
        CpLayout{"CP4_MTP", 4, {"--mtp-num-layers", "1"}, cp(4)},
        CpLayout{"CP2_TP2_MTP", 4, {"--mtp-num-layers", "1"}, cp(2) + kTP2}, CpLayout{"CP4", 4, {}, cp(4)},
        CpLayout{"CP4_a2a_p2p",
                 4,
                 {},
                 cp(4, "a2a+p2p") + std::vector<std::string>{"--hierarchical-context-parallel-sizes", "2", "2"}},
        CpLayout{"CP2_TP2_SP", 4, {}, cp(2) + kTP2},
        CpLayout{"CP2_DP2_distopt",
                 4,
                 {},
                 cp(2) + std::vector<std::string>{"--expert-model-parallel-size", "2", "--use-distributed-optimizer"}},
        CpLayout{"CP2_PP2",
                 4,
                 {"--num-layers", "4", "--moe-layer-freq", "[0,1,1,0]"},
                 cp(2) + std::vector<std::string>{"--pipeline-model-parallel-size", "2"}},
        CpLayout{"CP2_TP2_DP2_EP4",
                 8,
                 {},
                 cp(2) + kTP2 +
                     std::vector<std::string>{"--expert-model-parallel-size", "4", "--use-distributed-optimizer"}}),
    [](const ::testing::TestParamInfo<CpLayout>& i) { return i.param.name; });

// Saved under CP2 (DP2), loaded under CP1 (DP4) and CP4: the next steps equal the CP2 run's.
TEST(CpCheckpoint, SavedUnderCp2LoadsUnderCp1AndCp4) {
  const comm::ProcessGroup w = comm::ProcessGroup::world();
  if (w.size() != 4) GTEST_SKIP() << "runs on 4 ranks";
  const std::vector<std::string> args = train::override_flags(base_flags(), {"--train-iters", "4"});
  const std::string dir = testing::mpi_shared_dir(w, "cp_save");
  std::FILE* null = std::fopen("/dev/null", "w");
  std::vector<train::StepResult> want;
  {
    train::Trainer a(testing::small_config(args + cp(2), {"--save", dir}), null, false, &w);
    for (int i = 0; i < 2; i++) a.train_step();
    a.save_checkpoint();
    for (int i = 0; i < 2; i++) want.push_back(a.train_step());
  }
  for (int64_t c : {1, 4}) {
    train::Trainer b(testing::small_config(args + cp(c), {"--load", dir}), null, false, &w);
    ASSERT_EQ(b.iteration(), 2);
    for (int i = 0; i < 2; i++) testing::expect_same_step(want[static_cast<size_t>(i)], b.train_step(), i + 2);
  }
  std::fclose(null);
  w.barrier();
  if (w.rank() == 0) fs::remove_all(dir);
}

// Same seed and layout: bitwise identical losses; a resume under CP2 continues bitwise.
TEST(CpBitwise, RerunAndResumeAreBitwise) {
  const comm::ProcessGroup w = comm::ProcessGroup::world();
  if (w.size() != 2) GTEST_SKIP() << "runs on 2 ranks";
  const std::vector<std::string> args =
      train::override_flags(testing::tiny_moe_flags() + testing::mock_run_flags(16, 2, 4, 128, 5, "1e-3"),
                            {"--hidden-dropout", "0.1"}) +
      cp(2);
  std::FILE* null = std::fopen("/dev/null", "w");
  {
    train::Trainer a(testing::small_config(args), null, false, &w), b(testing::small_config(args), null, false, &w);
    for (int i = 0; i < 2; i++) {
      const auto ra = a.train_step(), rb = b.train_step();
      EXPECT_EQ(ra.lm_loss, rb.lm_loss);
      EXPECT_EQ(ra.grad_norm, rb.grad_norm);
    }
  }
  std::fclose(null);
  const std::string dir = testing::mpi_shared_dir(w, "cp_resume");
  testing::expect_bitwise_resume(
      [&](const std::vector<std::string>& extra) { return testing::small_config(args, extra); }, dir, w);
  w.barrier();
  if (w.rank() == 0) fs::remove_all(dir);
}

}  // namespace
}  // namespace moecore
