// Numerical faults under Megatron FSDP (train/health.h locate_nonfinite): with the parameters, gradients and
// optimizer state sharded, a step that goes non-finite is re-run with a probe on every module and every rank stops
// with the message one rank would give, naming the first non-finite place and its rank — a parameter by its shard.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "config_util.h"
#include "layout_util.h"
#include "moecore/comm/process_group.h"
#include "moecore/train/trainer.h"
#include "test_util.h"

namespace moecore {
namespace {

using testing::operator+;

train::TrainConfig fsdp_fault_config(const std::string& strategy, const std::vector<std::string>& extra) {
  return testing::small_config(
      train::override_flags(testing::tiny_moe_flags(), {"--num-layers", "2"}) +
      testing::mock_run_flags(16, 1, 4, 64, 3, "1e-3") +
      std::vector<std::string>{"--use-megatron-fsdp", "--data-parallel-sharding-strategy", strategy} + extra);
}

class FsdpFaults : public ::testing::TestWithParam<std::string> {};

// Weights drawn with std 1e30 overflow the first attention's scores: the first place is the attention of layer 0 in
// micro-batch 0, on rank 0, as on one rank.
TEST_P(FsdpFaults, NamesTheFirstNonFiniteModule) {
  const comm::ProcessGroup w = comm::ProcessGroup::world();
  if (w.size() < 2) GTEST_SKIP() << "needs 2 or more ranks";
  testing::NullOut null;
  const std::string place = "the forward output of decoder.layers.0.self_attention (micro-batch 0)";
  train::Trainer t(fsdp_fault_config(GetParam(), {"--init-method-std", "1e30"}), null.f, false, &w);
  const std::string e = testing::error_of([&] { t.train_step(); });
  EXPECT_NE(e.find(place + " on rank 0"), std::string::npos) << e;
  EXPECT_NE(e.find("The step was not applied"), std::string::npos) << e;
}

// A NaN planted in the last rank's shard of a weight (under optim_grads_params no rank holds the whole weight
// between steps; under optim_grads in its copy): every rank names that parameter, on the last rank.
TEST_P(FsdpFaults, NamesANonFiniteWeightShard) {
  const comm::ProcessGroup w = comm::ProcessGroup::world();
  if (w.size() < 2) GTEST_SKIP() << "needs 2 or more ranks";
  testing::NullOut null;
  train::Trainer t(fsdp_fault_config(GetParam(), {}), null.f, false, &w);
  t.train_step();
  // The last rank plants a NaN in what it holds of a weight of layer 1 (the first it holds elements of).
  std::string name;
  if (w.rank() == w.size() - 1) {
    for (const auto& h : t.optimizer().held_values())
      if (name.empty() && h.p->name.find("decoder.layers.1.") == 0 && h.values.numel() > 0) {
        Tensor v = h.values;  // a view of the shard
        v.set_item(0, std::numeric_limits<double>::quiet_NaN());
        name = h.p->name;
      }
    EXPECT_FALSE(name.empty());
  }
  const std::string e = testing::error_of([&] { t.train_step(); });
  EXPECT_NE(e.find("the parameter decoder.layers.1."), std::string::npos) << e;
  EXPECT_NE(e.find("on rank " + std::to_string(w.size() - 1)), std::string::npos) << e;
  if (w.rank() == w.size() - 1) EXPECT_NE(e.find("the parameter " + name + " "), std::string::npos) << e;
}

// A save refused on every rank (no hang) when one rank's shard holds a NaN, naming the parameter, the shard's
// elements and the rank.
TEST(FsdpFaultsSave, RefusedOnEveryRankNamingTheShard) {
  const comm::ProcessGroup w = comm::ProcessGroup::world();
  if (w.size() < 2) GTEST_SKIP() << "needs 2 or more ranks";
  testing::NullOut null;
  const std::string dir = testing::mpi_shared_dir(w, "fsdp_fault_save");
  train::Trainer t(fsdp_fault_config("optim_grads_params", {"--save", dir}), null.f, false, &w);
  t.train_step();
  if (w.rank() == w.size() - 1) {
    bool planted = false;  // in a shard that is part of its parameter
    for (const auto& h : t.optimizer().held_values())
      if (!planted && h.values.numel() > 0 && h.values.numel() < h.p->value.shape().numel()) {
        Tensor v = h.values;
        v.set_item(v.numel() - 1, std::numeric_limits<double>::infinity());
        planted = true;
      }
    EXPECT_TRUE(planted);
  }
  const std::string e = testing::error_of([&] { t.save_checkpoint(); });
  EXPECT_NE(e.find("refusing to save iteration 1: parameter "), std::string::npos) << e;
  EXPECT_NE(e.find("holds NaN or infinite values in its elements ["), std::string::npos) << e;
  EXPECT_NE(e.find("on rank " + std::to_string(w.size() - 1)), std::string::npos) << e;
}

INSTANTIATE_TEST_SUITE_P(Strategies, FsdpFaults, ::testing::Values("optim_grads", "optim_grads_params"));

}  // namespace
}  // namespace moecore
