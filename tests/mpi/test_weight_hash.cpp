// --check-weight-hash-across-dp-replicas-interval (train/health.h): identical data-parallel replicas pass; a
// replica whose bytes differ on one rank stops every rank with the parameter named.
#include <gtest/gtest.h>

#include "config_util.h"
#include "moecore/comm/process_group.h"
#include "moecore/train/observe/health.h"
#include "test_util.h"

namespace moecore {
namespace {

using testing::operator+;

TEST(WeightHash, NamesTheParameterWhoseReplicasDiffer) {
  const comm::ProcessGroup w = comm::ProcessGroup::world();
  const train::TrainConfig c =
      testing::small_config(testing::tiny_moe_flags() + testing::mock_run_flags(16, 1, w.size(), 64, 1, "1e-3"));
  const train::ParallelGroups g(c, &w);
  nn::ParamRegistry reg;
  reg.add("decoder.layers.0.mlp.linear_fc1.weight", {3, 4}, nn::InitRule::normal(0.02));
  reg.add("embedding.word_embeddings.weight", {5, 4}, nn::InitRule::normal(0.02));
  reg.initialize(7);  // the same values on every rank
  EXPECT_EQ(testing::error_of([&] { train::check_weight_hashes_across_dp(reg, g, 3); }), "");
  if (w.size() == 1) return;
  if (w.rank() == w.size() - 1) reg.all()[1]->value.set_item(2, 0.5);  // one replica drifts
  const std::string e = testing::user_error_of([&] { train::check_weight_hashes_across_dp(reg, g, 3); });
  EXPECT_NE(e.find("at iteration 3 the data-parallel replicas of embedding.word_embeddings.weight differ"),
            std::string::npos)
      << e;
}

}  // namespace
}  // namespace moecore
