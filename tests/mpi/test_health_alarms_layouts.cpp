// Health alarms across ranks (train/routing_health.h): the routing they judge is the one-rank routing under EP2
// (counts summed over the ranks), and a stop alarm ends every rank at the same step with the same message naming
// the expert-parallel rank that holds the dead expert (no rank left waiting in a collective).
#include <gtest/gtest.h>

#include <cmath>

#include "config_util.h"
#include "moecore/comm/process_group.h"
#include "moecore/moe/moe_layer.h"
#include "moecore/train/observe/routing_health.h"
#include "moecore/train/trainer.h"
#include "test_util.h"

namespace moecore {
namespace {

using testing::operator+;

std::vector<std::string> steered_flags(int64_t ranks) {
  return testing::tiny_moe_flags() + testing::mock_run_flags(16, 1, 2 * ranks, 64, 4, "1e-3") +
         std::vector<std::string>{"--moe-router-score-function",
                                  "sigmoid",
                                  "--moe-router-enable-expert-bias",
                                  "--moe-router-bias-update-rate",
                                  "0",
                                  "--moe-dead-expert-steps",
                                  "2"};
}

void steer(train::Trainer& t) {  // expert 3 (on EP rank 1 of 2) gets no token
  for (moe::MoELayer* l : t.moe_layers()) l->router().expert_bias().set_item(3, -1e4);
}

TEST(HealthAlarmsLayouts, RoutingJudgedIsTheOneRankRoutingUnderEP2) {
  const comm::ProcessGroup w = comm::ProcessGroup::world();
  if (w.size() < 2) GTEST_SKIP() << "needs 2 or more ranks";
  const auto base = steered_flags(w.size());
  std::FILE* null = std::fopen("/dev/null", "w");
  {
    train::Trainer one(testing::small_config(base), null, false, nullptr);
    train::Trainer ep(testing::small_config(base, {"--expert-model-parallel-size", "2"}), null, false, &w);
    const train::ParallelGroups single(one.config(), nullptr), groups(ep.config(), &w);
    for (int step = 0; step < 2; step++) {
      one.train_step();
      ep.train_step();
      const auto a = train::global_routing(one.model(), single), b = train::global_routing(ep.model(), groups);
      ASSERT_EQ(a.size(), b.size());
      for (size_t l = 0; l < a.size(); l++) {
        EXPECT_EQ(a[l].tokens_per_expert, b[l].tokens_per_expert) << "step " << step << " layer " << l;
        EXPECT_NEAR(a[l].entropy, b[l].entropy, 1e-5 * a[l].entropy) << "step " << step << " layer " << l;
      }
    }
  }
  std::fclose(null);
}

TEST(HealthAlarmsLayouts, AStopAlarmStopsEveryRankAtTheSameStep) {
  const comm::ProcessGroup w = comm::ProcessGroup::world();
  if (w.size() < 2) GTEST_SKIP() << "needs 2 or more ranks";
  std::FILE* null = std::fopen("/dev/null", "w");
  {
    train::Trainer t(testing::small_config(steered_flags(w.size()),
                                           {"--expert-model-parallel-size", "2", "--health-alarm-stop", "dead-expert"}),
                     null, false, &w);
    steer(t);
    const std::string e = testing::user_error_of([&] { t.run(); });
    EXPECT_NE(e.find("iteration 2: layer 0: expert 3 (on expert-parallel rank 1) received no tokens for 2 steps"),
              std::string::npos)
        << "rank " << w.rank() << ": " << e;
    EXPECT_EQ(t.iteration(), 2) << "rank " << w.rank();
  }
  std::fclose(null);
}

}  // namespace
}  // namespace moecore
