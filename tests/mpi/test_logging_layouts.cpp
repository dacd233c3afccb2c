// Layout invariance of the logged figures: --log-params-norm (every parameter counted once, Megatron's
// calc_params_l2_norm), --log-num-zeros-in-grad (Megatron's count_zeros_fp32 over the reduced gradients) and the
// per-layer MoE losses of --moe-per-layer-logging give the single-rank run's values under DP, EP, TP+SP, ETP and
// the distributed optimizer (num zeros counted on each rank's shard of the reduced gradients there).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "config_util.h"
#include "moecore/comm/process_group.h"
#include "moecore/train/trainer.h"

namespace moecore {
namespace {

using testing::operator+;

struct LoggingLayoutsLayout {
  std::string name;
  int64_t world;  // ranks the layout needs (run on that world size only)
  std::vector<std::string> flags;
  bool layered = false;  // the three-layer model with every split (GQA, shared experts, a dense layer)
};

class LoggingLayouts : public ::testing::TestWithParam<LoggingLayoutsLayout> {};

TEST_P(LoggingLayouts, MatchSingleRank) {
  const comm::ProcessGroup w = comm::ProcessGroup::world();
  const LoggingLayoutsLayout& l = GetParam();
  if (w.size() != l.world) GTEST_SKIP() << l.name << " runs on " << l.world << " ranks";
  std::vector<std::string> args =
      train::override_flags((l.layered ? testing::layered_moe_flags() : testing::tiny_moe_flags()) +
                                testing::mock_run_flags(32, 2, 8, 120, 3, "1e-3"),
                            {"--make-vocab-size-divisible-by", "64", "--moe-router-load-balancing-type", "aux_loss",
                             "seq_aux_loss", "--moe-aux-loss-coeff", "1e-2", "1e-3", "--moe-z-loss-coeff", "1e-3",
                             "--log-params-norm", "--untie-embeddings-and-output-weights", "--moe-per-layer-logging"});
  args.push_back("--log-num-zeros-in-grad");
  const train::TrainConfig one = testing::small_config(args);
  const train::TrainConfig multi = testing::small_config(args, l.flags);
  std::FILE* null = std::fopen("/dev/null", "w");
  train::Trainer single(one, null, false, nullptr), par(multi, null, false, &w);
  for (int step = 0; step < 3; step++) {
    const auto a = single.train_step(), b = par.train_step();
    EXPECT_GT(a.params_norm, 0);
    EXPECT_NEAR(b.params_norm, a.params_norm, 1e-5 * a.params_norm) << "step " << step;
    EXPECT_GT(a.num_zeros, 0);
    EXPECT_EQ(b.num_zeros, a.num_zeros) << "step " << step;
    ASSERT_EQ(a.aux_layers.size(), b.aux_layers.size());
    for (size_t t = 0; t < a.aux_layers.size(); t++) {
      ASSERT_EQ(a.aux_layers[t].size(), b.aux_layers[t].size());
      for (size_t i = 0; i < a.aux_layers[t].size(); i++)
        EXPECT_NEAR(b.aux_layers[t][i], a.aux_layers[t][i], 1e-5 * std::fabs(a.aux_layers[t][i]))
            << "step " << step << " type " << t << " layer " << i;
    }
    ASSERT_EQ(a.z_layers.size(), b.z_layers.size());
    for (size_t i = 0; i < a.z_layers.size(); i++)
      EXPECT_NEAR(b.z_layers[i], a.z_layers[i], 1e-5 * std::fabs(a.z_layers[i])) << "step " << step;
  }
  std::fclose(null);
}

const std::vector<std::string> kLoggingLayoutsTP2{"--tensor-model-parallel-size", "2", "--sequence-parallel"};

INSTANTIATE_TEST_SUITE_P(
    Layouts, LoggingLayouts,
    ::testing::Values(
        LoggingLayoutsLayout{"DP2", 2, {}}, LoggingLayoutsLayout{"EP2", 2, {"--expert-model-parallel-size", "2"}},
        LoggingLayoutsLayout{"TP2_SP", 2,
                             kLoggingLayoutsTP2 + std::vector<std::string>{"--expert-tensor-parallel-size", "1"}, true},
        LoggingLayoutsLayout{"ETP2", 2, {"--expert-tensor-parallel-size", "2"}, true},
        LoggingLayoutsLayout{"DP2_distopt", 2, {"--use-distributed-optimizer"}},
        LoggingLayoutsLayout{"DP4xEP2", 4, {"--expert-model-parallel-size", "2"}},
        LoggingLayoutsLayout{"DP2xEP2xETP2", 4,
                             kLoggingLayoutsTP2 + std::vector<std::string>{"--expert-model-parallel-size", "2"}, true},
        LoggingLayoutsLayout{"TP2xEP2_folded", 4,
                             kLoggingLayoutsTP2 + std::vector<std::string>{"--expert-tensor-parallel-size", "1",
                                                                           "--expert-model-parallel-size", "2"},
                             true},
        LoggingLayoutsLayout{"TP2_DP2_distopt", 4,
                             kLoggingLayoutsTP2 + std::vector<std::string>{"--expert-tensor-parallel-size", "1",
                                                                           "--use-distributed-optimizer"},
                             true}),
    [](const ::testing::TestParamInfo<LoggingLayoutsLayout>& i) { return i.param.name; });

}  // namespace
}  // namespace moecore
