// Layout invariance of an MoE model with linear biases (Megatron's default --add-bias-linear: gating bias, expert fc1
// and fc2 biases, dense biases): data parallelism, expert parallelism (EP2 and EP4 folded over the data-parallel
// ranks, both dispatchers) and the distributed optimizer's expert shards give the single-rank run's per-step LM
// loss, aux losses and grad norm within 1e-5 relative. Expert biases need ETP 1 (as in Megatron), and moecore's
// tensor parallelism has no linear biases, so those layouts are not among them.
#include <gtest/gtest.h>

#include <algorithm>

#include "config_util.h"
#include "layout_util.h"
#include "moecore/comm/process_group.h"

namespace moecore {
namespace {

using testing::operator+;

struct BiasLayout {
  std::string name;
  int64_t world;
  std::vector<std::string> flags;
};

class ExpertBiasLayouts : public ::testing::TestWithParam<BiasLayout> {};

TEST_P(ExpertBiasLayouts, MatchSingleRank) {
  const comm::ProcessGroup w = comm::ProcessGroup::world();
  const BiasLayout& l = GetParam();
  if (w.size() != l.world) GTEST_SKIP() << l.name << " runs on " << l.world << " ranks";
  std::vector<std::string> model =
      train::override_flags(testing::tiny_moe_flags(), {"--hidden-size", "64", "--moe-ffn-hidden-size", "64"});
  model.erase(std::find(model.begin(), model.end(), "--disable-bias-linear"));
  const std::vector<std::string> args = model +
                                        std::vector<std::string>{"--moe-router-load-balancing-type",
                                                                 "aux_loss",
                                                                 "seq_aux_loss",
                                                                 "--moe-aux-loss-coeff",
                                                                 "1e-2",
                                                                 "1e-3",
                                                                 "--moe-z-loss-coeff",
                                                                 "1e-3"} +
                                        testing::mock_run_flags(32, 2, 8, 128, 5, "1e-3");
  testing::expect_same_steps(testing::small_config(args), testing::small_config(args, l.flags), w);
}

INSTANTIATE_TEST_SUITE_P(
    Bias, ExpertBiasLayouts,
    ::testing::Values(
        BiasLayout{"DP2", 2, {}}, BiasLayout{"EP2_alltoall", 2, {"--expert-model-parallel-size", "2"}},
        BiasLayout{
            "EP2_allgather", 2, {"--expert-model-parallel-size", "2", "--moe-token-dispatcher-type", "allgather"}},
        BiasLayout{"DP2xEP2_distopt", 4, {"--expert-model-parallel-size", "2", "--use-distributed-optimizer"}},
        BiasLayout{"EP4_distopt", 4, {"--expert-model-parallel-size", "4", "--use-distributed-optimizer"}}),
    [](const ::testing::TestParamInfo<BiasLayout>& i) { return i.param.name; });

}  // namespace
}  // namespace moecore
