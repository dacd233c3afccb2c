// Layout invariance of Megatron's default GPT: a tiny MoE model with LayerNorm, learned
// absolute position embeddings and qk-layernorm trained under DP, EP, TP+SP and TP+SP+EP gives the single-rank run's
// per-step lm loss and grad norm within 1e-5 relative (f32). Under TP+SP the position table and the norms' weights and
// biases are replicated and each rank's gradient covers its sequence shard only: summed over TP, they must match.
#include <gtest/gtest.h>

#include <cmath>

#include "config_util.h"
#include "layout_util.h"
#include "moecore/comm/process_group.h"
#include "moecore/train/trainer.h"

namespace moecore {
namespace {

using testing::operator+;

struct GptDefaultsLayoutsLayout {
  std::string name;
  int64_t world;  // ranks the layout needs (run on that world size only)
  std::vector<std::string> flags;
  std::vector<std::string> both = {};  // flags for the single-rank run too
};

class GptDefaultsLayouts : public ::testing::TestWithParam<GptDefaultsLayoutsLayout> {};

TEST_P(GptDefaultsLayouts, MatchSingleRank) {
  const comm::ProcessGroup w = comm::ProcessGroup::world();
  const GptDefaultsLayoutsLayout& l = GetParam();
  if (w.size() != l.world) GTEST_SKIP() << l.name << " runs on " << l.world << " ranks";
  // The layered model (GQA, qk-layernorm, untied output, a dense first layer, shared experts) with Megatron's
  // default norm and positions instead of RMSNorm and RoPE.
  std::vector<std::string> args =
      train::override_flags(testing::layered_moe_flags(),
                            {"--normalization", "LayerNorm", "--position-embedding-type", "learned_absolute"}) +
      testing::mock_run_flags(32, 2, 8, 120, 5, "1e-3") +
      std::vector<std::string>{"--make-vocab-size-divisible-by", "64"};
  args = train::override_flags(args, l.both);
  const train::TrainConfig one = testing::small_config(args);
  const train::TrainConfig multi = testing::small_config(args, l.flags);
  ASSERT_EQ(one.normalization, "LayerNorm");
  ASSERT_EQ(multi.position_embedding_type, one.position_embedding_type);
  testing::expect_same_steps(one, multi, w);
}

const std::vector<std::string> kGptDefaultsLayoutsTP2{"--tensor-model-parallel-size", "2", "--sequence-parallel"};

INSTANTIATE_TEST_SUITE_P(
    Layouts, GptDefaultsLayouts,
    ::testing::Values(
        GptDefaultsLayoutsLayout{"DP2", 2, {}},
        GptDefaultsLayoutsLayout{"EP2", 2, {"--expert-model-parallel-size", "2"}},
        GptDefaultsLayoutsLayout{
            "TP2_SP", 2, kGptDefaultsLayoutsTP2 + std::vector<std::string>{"--expert-tensor-parallel-size", "1"}},
        GptDefaultsLayoutsLayout{
            "TP2_SP_1p_none", 2, kGptDefaultsLayoutsTP2, {"--apply-layernorm-1p", "--position-embedding-type", "none"}},
        GptDefaultsLayoutsLayout{
            "TP2_SP_EP2", 4,
            kGptDefaultsLayoutsTP2 +
                std::vector<std::string>{"--expert-tensor-parallel-size", "1", "--expert-model-parallel-size", "2"}},
        GptDefaultsLayoutsLayout{"DP4_distopt", 4, {"--use-distributed-optimizer"}}),
    [](const ::testing::TestParamInfo<GptDefaultsLayoutsLayout>& i) { return i.param.name; });

}  // namespace
}  // namespace moecore
