// Layout invariance with dropout on (--hidden-dropout 0.1 --attention-dropout 0.1): masks are functions
// of global coordinates (seed, site, sample index, position, hidden or head index), so each layout drops the same
// elements as one rank and gives its per-step losses and grad norms within 1e-5 relative; the same layout run twice
// gives bitwise identical losses.
#include <gtest/gtest.h>

#include <cmath>

#include "config_util.h"
#include "layout_util.h"
#include "moecore/comm/process_group.h"
#include "moecore/train/trainer.h"

namespace moecore {
namespace {

using testing::operator+;

constexpr int kSteps = 4;

std::vector<std::string> dropout_run() {
  std::vector<std::string> args = testing::layered_moe_flags() +
                                  testing::mock_run_flags(32, 2, 8, 120, kSteps, "1e-3") +
                                  std::vector<std::string>{"--make-vocab-size-divisible-by", "64"};
  return train::override_flags(args, {"--hidden-dropout", "0.1", "--attention-dropout", "0.1"});
}

std::vector<train::StepResult> train_steps(const train::TrainConfig& c, const comm::ProcessGroup* w) {
  std::FILE* null = std::fopen("/dev/null", "w");
  std::vector<train::StepResult> r;
  {
    train::Trainer t(c, null, false, w);
    for (int s = 0; s < kSteps; s++) r.push_back(t.train_step());
  }
  std::fclose(null);
  return r;
}

struct DropoutLayoutsLayout {
  std::string name;
  int64_t world;  // 0: any world size
  std::vector<std::string> flags;
};

class DropoutLayouts : public ::testing::TestWithParam<DropoutLayoutsLayout> {};

TEST_P(DropoutLayouts, MatchSingleRank) {
  const comm::ProcessGroup w = comm::ProcessGroup::world();
  const DropoutLayoutsLayout& l = GetParam();
  if (l.world && w.size() != l.world) GTEST_SKIP() << l.name << " runs on " << l.world << " ranks";
  const auto one = train_steps(testing::small_config(dropout_run()), nullptr);
  const auto multi = train_steps(testing::small_config(dropout_run(), l.flags), &w);
  for (int s = 0; s < kSteps; s++)
    testing::expect_same_step(one[static_cast<size_t>(s)], multi[static_cast<size_t>(s)], s);
}

const std::vector<std::string> kDropoutLayoutsTP2{"--tensor-model-parallel-size", "2", "--sequence-parallel"};

INSTANTIATE_TEST_SUITE_P(
    Dropout, DropoutLayouts,
    ::testing::Values(
        DropoutLayoutsLayout{"DP", 0, {}}, DropoutLayoutsLayout{"EP2", 2, {"--expert-model-parallel-size", "2"}},
        DropoutLayoutsLayout{"TP2_SP", 2,
                             kDropoutLayoutsTP2 + std::vector<std::string>{"--expert-tensor-parallel-size", "1"}},
        DropoutLayoutsLayout{"TP2_SP_ETP2", 2, kDropoutLayoutsTP2},
        DropoutLayoutsLayout{"TP2xEP2_folded", 4,
                             kDropoutLayoutsTP2 + std::vector<std::string>{"--expert-tensor-parallel-size", "1",
                                                                           "--expert-model-parallel-size", "2"}},
        DropoutLayoutsLayout{"DP2xEP2xETP2", 4,
                             kDropoutLayoutsTP2 + std::vector<std::string>{"--expert-model-parallel-size", "2"}}),
    [](const ::testing::TestParamInfo<DropoutLayoutsLayout>& i) { return i.param.name; });

// Same seed and layout: bitwise identical losses and grad norms; and dropout is really on (every step's loss differs
// from the run without it; small at this init scale, but never equal).
TEST(DropoutLayouts, DeterministicAndEffective) {
  const comm::ProcessGroup w = comm::ProcessGroup::world();
  const train::TrainConfig c = testing::small_config(dropout_run(), kDropoutLayoutsTP2);
  const auto a = train_steps(c, &w), b = train_steps(c, &w);
  const auto off = train_steps(
      testing::small_config(dropout_run(), kDropoutLayoutsTP2 + std::vector<std::string>{"--hidden-dropout", "0",
                                                                                         "--attention-dropout", "0"}),
      &w);
  for (int s = 0; s < kSteps; s++) {
    EXPECT_EQ(a[s].lm_loss, b[s].lm_loss) << "step " << s;
    EXPECT_EQ(a[s].grad_norm, b[s].grad_norm) << "step " << s;
    EXPECT_NE(a[s].lm_loss, off[s].lm_loss) << "step " << s;  // dropout ignored would give equal losses
  }
}

}  // namespace
}  // namespace moecore
