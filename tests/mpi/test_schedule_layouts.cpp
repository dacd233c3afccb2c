// Layout invariance of --calculate-per-token-loss with --eod-mask-loss (micro-batches with different
// numbers of loss tokens): the tiny MoE job under DP, EP, TP+SP (and on 4 ranks DP4, EP2xDP2, TP2xDP2) gives the
// single-rank run's per-step lm loss, grad norm, aux and z losses within 1e-5 relative, over a sample-based schedule.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "config_util.h"
#include "layout_util.h"
#include "moecore/comm/process_group.h"
#include "moecore/train/trainer.h"

namespace moecore {
namespace {

using testing::operator+;

struct ScheduleLayoutsLayout {
  std::string name;
  int64_t world;
  std::vector<std::string> flags;
};

class ScheduleLayouts : public ::testing::TestWithParam<ScheduleLayoutsLayout> {};

TEST_P(ScheduleLayouts, PerTokenLossMatchesSingleRank) {
  const comm::ProcessGroup w = comm::ProcessGroup::world();
  const ScheduleLayoutsLayout& l = GetParam();
  if (w.size() != l.world) GTEST_SKIP() << l.name << " runs on " << l.world << " ranks";
  // 15 mock tokens + NullTokenizer's EOD: one token in 16 carries no loss, a different number per micro-batch.
  const std::vector<std::string> args =
      train::override_flags(testing::tiny_moe_flags(), {"--hidden-size", "64", "--moe-ffn-hidden-size", "64"}) +
      std::vector<std::string>{"--moe-aux-loss-coeff",
                               "1e-2",
                               "--moe-z-loss-coeff",
                               "1e-3",
                               "--tokenizer-type",
                               "NullTokenizer",
                               "--eod-mask-loss",
                               "--calculate-per-token-loss",
                               "--train-samples",
                               "40",
                               "--lr-warmup-samples",
                               "16",
                               "--lr-decay-style",
                               "cosine",
                               "--log-interval",
                               "100",
                               "--seq-length",
                               "32",
                               "--micro-batch-size",
                               "2",
                               "--global-batch-size",
                               "8",
                               "--mock-data",
                               "--vocab-size",
                               "15",
                               "--lr",
                               "1e-3",
                               "--eval-iters",
                               "0",
                               "--make-vocab-size-divisible-by",  // 16 rows on one rank and under TP2 alike
                               "8"};
  std::FILE* null = std::fopen("/dev/null", "w");
  train::Trainer single(testing::small_config(args), null, false, nullptr);
  train::Trainer multi(testing::small_config(args, l.flags), null, false, &w);
  for (int step = 0; step < 5; step++) {
    const auto a = single.train_step(), b = multi.train_step();
    EXPECT_EQ(b.lr, a.lr) << "step " << step;
    testing::expect_same_step(a, b, step);
  }
  EXPECT_EQ(multi.iteration(), 5);  // 40 samples / 8
  std::fclose(null);
}

const std::vector<std::string> kScheduleLayoutsTP2{"--tensor-model-parallel-size", "2", "--sequence-parallel"};

INSTANTIATE_TEST_SUITE_P(
    Layouts, ScheduleLayouts,
    ::testing::Values(
        ScheduleLayoutsLayout{"DP2", 2, {}}, ScheduleLayoutsLayout{"EP2", 2, {"--expert-model-parallel-size", "2"}},
        ScheduleLayoutsLayout{"TP2_SP", 2, kScheduleLayoutsTP2}, ScheduleLayoutsLayout{"DP4", 4, {}},
        ScheduleLayoutsLayout{"EP2_DP2", 4, {"--expert-model-parallel-size", "2", "--use-distributed-optimizer"}},
        ScheduleLayoutsLayout{"TP2_DP2", 4,
                              kScheduleLayoutsTP2 + std::vector<std::string>{"--expert-model-parallel-size", "2"}}),
    [](const ::testing::TestParamInfo<ScheduleLayoutsLayout>& i) { return i.param.name; });

}  // namespace
}  // namespace moecore
