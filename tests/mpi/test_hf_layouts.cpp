// A HuggingFace DeepSeek-V3 imported with --load-hf trains in every layout as on one rank: MLA heads split over TP,
// experts over EP, the layers and the MTP depth (last stage) over PP, and the expert bias (e_score_correction_bias)
// on every rank that routes. Each step's loss, gradient norm, aux losses and MTP losses equal the one-rank run's
// within 1e-5. The model: tests/ckpt/hf_deepseek_writer.h (3 layers, the first dense, 16 experts top-4 in 4 groups,
// a shared expert, YaRN, one MTP depth).
#include <gtest/gtest.h>

#include "ckpt/hf_deepseek_writer.h"
#include "config_util.h"
#include "layout_util.h"

namespace moecore {
namespace {

using testing::operator+;

struct HFLayout {
  std::string name;
  int64_t world;
  std::vector<std::string> flags;
};

class HFLayouts : public ::testing::TestWithParam<HFLayout> {};

TEST_P(HFLayouts, ImportedDeepSeekV3MatchesOneRank) {
  const comm::ProcessGroup w = comm::ProcessGroup::world();
  const HFLayout& l = GetParam();
  if (w.size() != l.world) GTEST_SKIP() << l.name << " runs on " << l.world << " ranks";
  const std::string dir = testing::mpi_shared_dir(w, "hf_" + l.name);
  if (w.rank() == 0) testing::write_deepseek(dir, testing::deepseek_config());
  w.barrier();
  const std::vector<std::string> args =
      testing::mock_run_flags(16, 2, 8, 96, 3, "1e-3") +
      std::vector<std::string>{"--load-hf", dir, "--moe-router-bias-update-rate", "1e-2", "--moe-aux-loss-coeff",
                               "1e-3"};
  std::FILE* null = std::fopen("/dev/null", "w");
  {
    train::Trainer one(testing::small_config(args), null, false, nullptr),
        multi(testing::small_config(args, l.flags), null, false, &w);
    for (int step = 0; step < 3; step++) {
      const train::StepResult a = one.train_step(), b = multi.train_step();
      ASSERT_EQ(a.mtp_losses.size(), 1u) << "the imported MTP depth trains";
      testing::expect_same_step(a, b, step);  // the MTP losses too
    }
  }
  std::fclose(null);
  w.barrier();
  if (w.rank() == 0) std::filesystem::remove_all(dir);
}

const std::vector<std::string> kHfTP2{"--tensor-model-parallel-size", "2", "--sequence-parallel",
                                      "--expert-tensor-parallel-size", "1"};
const std::vector<std::string> kHfEP2{"--expert-model-parallel-size", "2"};
const std::vector<std::string> kHfPP2{"--pipeline-model-parallel-size", "2", "--pipeline-model-parallel-layout",
                                      "Et|ttmL"};

INSTANTIATE_TEST_SUITE_P(Layouts, HFLayouts,
                         ::testing::Values(HFLayout{"TP2_SP", 2, kHfTP2}, HFLayout{"EP2", 2, kHfEP2},
                                           HFLayout{"PP2", 2, kHfPP2}, HFLayout{"TP2xEP2", 4, kHfTP2 + kHfEP2},
                                           HFLayout{"PP2xEP2", 4, kHfPP2 + kHfEP2}),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace moecore
