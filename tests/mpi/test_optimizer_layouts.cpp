// Layout invariance of the optimizers beside Adam: Muon (whole-matrix Newton–Schulz over TP/ETP shards, per expert),
// Megatron's layer-wise distributed Muon (dist_muon, or muon with --use-distributed-optimizer) and SGD with
// momentum, trained 5 steps under DP, EP, TP+SP, ETP, the distributed optimizer and its K instances, give the
// single-rank run's losses and grad norms within 1e-5 relative (Newton–Schulz in fp32: see Muon_bf16NS_DP2).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "config_util.h"
#include "layout_util.h"
#include "moecore/comm/process_group.h"
#include "moecore/train/trainer.h"
#include "test_util.h"

namespace moecore {
namespace {

using testing::operator+;

struct OptLayout {
  std::string name;
  int64_t world;                   // ranks the layout needs
  std::vector<std::string> both;   // the optimizer flags (single rank too)
  std::vector<std::string> flags;  // the layout
  double tol = 1e-5;               // relative
  bool differs = false;            // the layout changes the math (--muon-tp-mode blockwise): must NOT match
};

class OptimizerLayouts : public ::testing::TestWithParam<OptLayout> {};

TEST_P(OptimizerLayouts, MatchSingleRank) {
  const comm::ProcessGroup w = comm::ProcessGroup::world();
  const OptLayout& l = GetParam();
  if (w.size() != l.world) GTEST_SKIP() << l.name << " runs on " << l.world << " ranks";
  std::vector<std::string> args =
      train::override_flags(testing::layered_moe_flags(),
                            {"--moe-router-load-balancing-type", "aux_loss", "--moe-aux-loss-coeff", "1e-2"}) +
      testing::mock_run_flags(32, 2, 8, 120, 5, "1e-2") +
      std::vector<std::string>{"--make-vocab-size-divisible-by", "64", "--weight-decay", "0.1"};
  args = train::override_flags(args, l.both);
  const train::TrainConfig one = testing::small_config(args);
  std::FILE* null = std::fopen("/dev/null", "w");
  train::Trainer single(one, null, false, nullptr), multi(testing::small_config(args, l.flags), null, false, &w);
  double max_rel = 0;
  for (int step = 0; step < 5; step++) {
    const auto a = single.train_step(), b = multi.train_step();
    max_rel = std::max(max_rel, std::fabs(b.lm_loss - a.lm_loss) / std::fabs(a.lm_loss));
    if (!l.differs) testing::expect_same_step(a, b, step, l.tol);
  }
  if (l.differs) {
    EXPECT_GT(max_rel, 1e-4) << "blockwise Newton-Schulz of TP shards should change the run";
  }
  std::fclose(null);
}

const std::vector<std::string> kMuon{"--optimizer", "muon", "--muon-fp32-matmul-prec", "high"};
const std::vector<std::string> kDistMuon{"--optimizer", "dist_muon", "--muon-fp32-matmul-prec", "high"};
// Megatron's default precision (medium) too: Newton-Schulz runs in fp32 for every precision (docs/differences.md).
const std::vector<std::string> kSgd{"--optimizer", "sgd", "--sgd-momentum", "0.9"};
const std::vector<std::string> kOptimizerLayoutsTP2{"--tensor-model-parallel-size", "2", "--sequence-parallel"};
const std::vector<std::string> kDistOpt{"--use-distributed-optimizer"};
// Megatron's precision-aware optimizer with bf16 Adam moments (DeepSeek-V3's recipe): one rank keeps whole bf16
// moments, the distributed optimizer bf16 shards; the same update either way.
const std::vector<std::string> kBf16Moments{"--use-distributed-optimizer",
                                            "--use-precision-aware-optimizer",
                                            "--exp-avg-dtype",
                                            "bf16",
                                            "--exp-avg-sq-dtype",
                                            "bf16"};

INSTANTIATE_TEST_SUITE_P(
    Layouts, OptimizerLayouts,
    ::testing::Values(
        OptLayout{"Muon_DP2", 2, kMuon, {}},
        OptLayout{"Muon_default_precision_DP2", 2, {"--optimizer", "muon", "--muon-nesterov"}, {}},
        OptLayout{"Muon_EP2", 2, kMuon, {"--expert-model-parallel-size", "2"}},
        OptLayout{"Muon_TP2_SP", 2, kMuon,
                  kOptimizerLayoutsTP2 + std::vector<std::string>{"--expert-tensor-parallel-size", "1"}},
        OptLayout{"Muon_TP2_ETP2_noSplitQkv", 2, kMuon + std::vector<std::string>{"--muon-no-split-qkv"},
                  kOptimizerLayoutsTP2},
        OptLayout{"Muon_distopt_DP2", 2, kMuon, kDistOpt},
        OptLayout{"Muon_TP2_blockwise_differs", 2, kMuon + std::vector<std::string>{"--muon-tp-mode", "blockwise"},
                  kOptimizerLayoutsTP2 + std::vector<std::string>{"--expert-tensor-parallel-size", "1"}, 1e-5, true},
        OptLayout{"DistMuon_DP2", 2, kDistMuon, {}}, OptLayout{"Sgd_DP2", 2, kSgd, {}},
        OptLayout{"Adam_bf16_moments_DP2", 2, kBf16Moments, {}},
        OptLayout{"Adam_bf16_moments_EP2", 2, kBf16Moments, {"--expert-model-parallel-size", "2"}},
        OptLayout{"Adam_bf16_moments_DP4_K2", 4, kBf16Moments, {"--num-distributed-optimizer-instances", "2"}},
        OptLayout{"Sgd_distopt_EP2", 2, kSgd, kDistOpt + std::vector<std::string>{"--expert-model-parallel-size", "2"}},
        OptLayout{"DistMuon_DP4", 4, kDistMuon, {}},
        OptLayout{"Adam_distopt_DP4_K2",
                  4,
                  {},
                  kDistOpt + std::vector<std::string>{"--num-distributed-optimizer-instances", "2"}},
        OptLayout{"Sgd_distopt_DP4xEP2_K2", 4, kSgd,
                  kDistOpt + std::vector<std::string>{"--num-distributed-optimizer-instances", "2",
                                                      "--expert-model-parallel-size", "2"}},
        OptLayout{"Muon_distopt_TP2xDP2", 4, kMuon,
                  kOptimizerLayoutsTP2 + kDistOpt + std::vector<std::string>{"--expert-tensor-parallel-size", "1"}},
        OptLayout{"DistMuon_DP2xEP2xETP2", 4, kDistMuon,
                  kOptimizerLayoutsTP2 + std::vector<std::string>{"--expert-model-parallel-size", "2"}}),
    [](const ::testing::TestParamInfo<OptLayout>& i) { return i.param.name; });

// Layer-wise distributed Muon (each matrix's momentum on one DP rank) and the K-instance distributed optimizer save
// whole per-parameter state and resume bitwise identically.
TEST(OptimizerCheckpoints, DistributedStateResumesBitwise) {
  const comm::ProcessGroup w = comm::ProcessGroup::world();
  // One fresh directory for all ranks: rank 0's name, broadcast.
  Tensor name = Tensor::zeros({256}, DType::I64);
  if (w.rank() == 0) {
    const std::string d = testing::fresh_temp_path("optim_ckpt_" + std::to_string(w.size()));
    for (size_t i = 0; i < d.size() && i < 255; i++) name.data<int64_t>()[i] = d[i];
  }
  w.broadcast(name, 0);
  std::string dir;
  for (int64_t i = 0; i < 256 && name.data<int64_t>()[i] != 0; i++) dir += static_cast<char>(name.data<int64_t>()[i]);
  std::vector<std::vector<std::string>> runs = {
      kDistMuon + std::vector<std::string>{"--expert-model-parallel-size", "2"},
      kBf16Moments + std::vector<std::string>{"--expert-model-parallel-size", "2"}};
  if (w.size() == 4)
    runs.push_back(kSgd + kDistOpt + std::vector<std::string>{"--num-distributed-optimizer-instances", "2"});
  std::FILE* null = std::fopen("/dev/null", "w");
  for (size_t k = 0; k < runs.size(); k++) {
    const std::vector<std::string> args = testing::layered_moe_flags() +
                                          testing::mock_run_flags(32, 2, 8, 100, 5, "1e-2") +
                                          std::vector<std::string>{"--weight-decay", "0.1"} + runs[k];
    const std::string d = dir + "_" + std::to_string(k);
    std::vector<train::StepResult> want;
    {
      train::Trainer straight(testing::small_config(args), null, false, &w);
      for (int i = 0; i < 5; i++) want.push_back(straight.train_step());
    }
    {
      train::Trainer first(testing::small_config(args, {"--save", d}), null, false, &w);
      for (int i = 0; i < 2; i++) first.train_step();
      first.save_checkpoint();
    }
    train::Trainer resumed(testing::small_config(args, {"--load", d}), null, false, &w);
    ASSERT_EQ(resumed.iteration(), 2);
    for (size_t i = 2; i < 5; i++) {
      const auto r = resumed.train_step();
      EXPECT_EQ(r.lm_loss, want[i].lm_loss) << runs[k][1] << " step " << i;
      EXPECT_EQ(r.grad_norm, want[i].grad_norm) << runs[k][1] << " step " << i;
    }
    w.barrier();
    if (w.rank() == 0) std::filesystem::remove_all(d);
  }
  std::fclose(null);
}

}  // namespace
}  // namespace moecore
