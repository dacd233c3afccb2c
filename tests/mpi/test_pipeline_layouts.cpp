// Layout invariance of pipeline parallelism: a tiny MoE job under 1F1B (PP2, PP4), interleaved 1F1B (PP2
// with two virtual stages), and PP combined with TP+SP, EP, DP and the distributed optimizer gives the single-rank
// run's per-step lm loss, grad norm, aux and z losses within 1e-5 relative; tied and untied output layers, Megatron's
// default LayerNorm + learned positions, dense and MoE layers on different stages, per-token loss; uneven stages
// from --decoder-first-pipeline-num-layers, the account-for options and --pipeline-model-parallel-layout (an
// empty stage included).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "config_util.h"
#include "layout_util.h"
#include "moecore/comm/process_group.h"
#include "moecore/train/trainer.h"

namespace moecore {
namespace {

using testing::operator+;

struct PipelineLayoutsLayout {
  std::string name;
  int64_t world;
  std::vector<std::string> flags;   // the model and run (both runs)
  std::vector<std::string> layout;  // the parallel layout (the multi-rank run)
};

std::vector<std::string> base_flags() {
  return testing::four_layer_moe_flags(3);
}

class PipelineLayouts : public ::testing::TestWithParam<PipelineLayoutsLayout> {};

TEST_P(PipelineLayouts, MatchSingleRank) {
  const comm::ProcessGroup w = comm::ProcessGroup::world();
  const PipelineLayoutsLayout& l = GetParam();
  if (w.size() != l.world) GTEST_SKIP() << l.name << " runs on " << l.world << " ranks";
  const std::vector<std::string> args = train::override_flags(base_flags(), l.flags);
  testing::expect_same_steps(testing::small_config(args), testing::small_config(args + l.layout), w, 3);
}

const std::vector<std::string> kPipelineLayoutsPP2{"--pipeline-model-parallel-size", "2"};
const std::vector<std::string> kVPP2{"--pipeline-model-parallel-size", "2", "--num-virtual-stages-per-pipeline-rank",
                                     "2"};

INSTANTIATE_TEST_SUITE_P(
    PP, PipelineLayouts,
    ::testing::Values(
        PipelineLayoutsLayout{"PP2", 2, {}, kPipelineLayoutsPP2},
        PipelineLayoutsLayout{"PP2Untied", 2, {"--untie-embeddings-and-output-weights"}, kPipelineLayoutsPP2},
        PipelineLayoutsLayout{"PP2MegatronDefaults",
                              2,
                              {"--normalization", "LayerNorm", "--position-embedding-type", "learned_absolute"},
                              kPipelineLayoutsPP2},
        PipelineLayoutsLayout{"PP2PerTokenLoss", 2, {"--calculate-per-token-loss"}, kPipelineLayoutsPP2},
        PipelineLayoutsLayout{"PP2Interleaved", 2, {}, kVPP2},
        PipelineLayoutsLayout{"PP2InterleavedByLayers",
                              2,
                              {},
                              {"--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage", "1"}},
        PipelineLayoutsLayout{"PP4", 4, {}, {"--pipeline-model-parallel-size", "4"}},
        PipelineLayoutsLayout{
            "PP2xTP2xSP",
            4,
            {},
            kPipelineLayoutsPP2 + std::vector<std::string>{"--tensor-model-parallel-size", "2", "--sequence-parallel"}},
        PipelineLayoutsLayout{
            "PP2xEP2", 4, {}, kPipelineLayoutsPP2 + std::vector<std::string>{"--expert-model-parallel-size", "2"}},
        PipelineLayoutsLayout{"PP2xDP2xEP2DistOpt",
                              4,
                              {},
                              kPipelineLayoutsPP2 + std::vector<std::string>{"--expert-model-parallel-size", "2",
                                                                             "--use-distributed-optimizer"}},
        PipelineLayoutsLayout{"PP2InterleavedxDP2", 4, {}, kVPP2},
        // 8 ranks (CTest mpi_tests_8_ranks): each stage's 4 ranks are DP4 for the dense layers and EP4 for the experts.
        PipelineLayoutsLayout{"PP2xDP4xEP4DistOpt",
                              8,
                              {},
                              kPipelineLayoutsPP2 + std::vector<std::string>{"--expert-model-parallel-size", "4",
                                                                             "--use-distributed-optimizer"}},
        // Uneven stage layouts (train/pipeline_layout.cpp): first stage given, the two account-for options, a
        // layout string, and a layout string with virtual stages.
        PipelineLayoutsLayout{
            "PP2UnevenFirst",
            2,
            {},
            kPipelineLayoutsPP2 + std::vector<std::string>{"--decoder-first-pipeline-num-layers", "1"}},
        PipelineLayoutsLayout{
            "PP2AccountForEmbeddingAndLoss",
            2,
            {},
            kPipelineLayoutsPP2 + std::vector<std::string>{"--account-for-embedding-in-pipeline-split",
                                                           "--account-for-loss-in-pipeline-split"}},
        PipelineLayoutsLayout{
            "PP2LayoutString",
            2,
            {},
            kPipelineLayoutsPP2 + std::vector<std::string>{"--pipeline-model-parallel-layout", "Et|tttL"}},
        PipelineLayoutsLayout{
            "PP2LayoutStringInterleaved",
            2,
            {},
            kPipelineLayoutsPP2 + std::vector<std::string>{"--pipeline-model-parallel-layout", "E|t*2|t|tL"}},
        PipelineLayoutsLayout{
            "PP4LayoutStringxTP1",
            4,
            {},
            {"--pipeline-model-parallel-size", "4", "--pipeline-model-parallel-layout", "Ett||t|tL"}}),
    [](const ::testing::TestParamInfo<PipelineLayoutsLayout>& i) { return i.param.name; });

}  // namespace
}  // namespace moecore

namespace moecore {
namespace {

// Evaluation runs forward passes through the stages (interleaved too): the validation loss equals one rank's.
TEST(PipelineEvaluation, MatchesSingleRank) {
  const comm::ProcessGroup w = comm::ProcessGroup::world();
  if (w.size() != 2) GTEST_SKIP() << "runs on 2 ranks";
  const std::vector<std::string> args =
      train::override_flags(base_flags(), {"--eval-iters", "2", "--eval-interval", "1000"});
  std::FILE* null = std::fopen("/dev/null", "w");
  {
    train::Trainer one(testing::small_config(args), null, false, nullptr);
    train::Trainer pp(testing::small_config(args + kVPP2), null, false, &w);
    one.train_step();
    pp.train_step();
    const double a = one.evaluate(2), b = pp.evaluate(2);
    EXPECT_GT(a, 0);
    EXPECT_NEAR(b, a, 1e-5 * a);
  }
  std::fclose(null);
}

}  // namespace
}  // namespace moecore
