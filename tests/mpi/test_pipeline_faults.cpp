// Numerical faults under pipeline parallelism (train/health.h locate_nonfinite_pipeline), also under the combined 1F1B
// schedule: a step that goes non-finite is re-run through the stages with a probe on every module, and every rank
// stops with the same message naming the first non-finite place over the whole pipeline, its rank and stage — as one
// rank would name it.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "config_util.h"
#include "moecore/comm/process_group.h"
#include "moecore/train/trainer.h"
#include "test_util.h"

namespace moecore {
namespace {

using testing::operator+;

train::TrainConfig pp_fault_config(bool pipeline, const std::vector<std::string>& extra) {
  std::vector<std::string> args = train::override_flags(testing::tiny_moe_flags(), {"--num-layers", "2"}) +
                                  testing::mock_run_flags(16, 1, 4, 64, 3, "1e-3") + extra;
  if (pipeline) args = args + std::vector<std::string>{"--pipeline-model-parallel-size", "2"};
  return testing::small_config(args);
}

// Weights drawn with std 1e30 overflow the first attention's scores: on one rank and under PP2 the first place is
// the attention of layer 0 in micro-batch 0, on stage 0.
TEST(PipelineFaults, NamesTheFirstNonFiniteModuleOverTheStages) {
  const comm::ProcessGroup w = comm::ProcessGroup::world();
  if (w.size() != 2) GTEST_SKIP() << "runs on 2 ranks";
  testing::NullOut null;
  const std::string place = "the forward output of decoder.layers.0.self_attention (micro-batch 0)";
  {
    train::Trainer one(pp_fault_config(false, {"--init-method-std", "1e30"}), null.f, false, nullptr);
    const std::string e = testing::error_of([&] { one.train_step(); });
    EXPECT_NE(e.find(place), std::string::npos) << e;
  }
  train::Trainer pp(pp_fault_config(true, {"--init-method-std", "1e30"}), null.f, false, &w);
  const std::string e = testing::error_of([&] { pp.train_step(); });
  EXPECT_NE(e.find(place + " on rank 0 (pipeline stage 0)"), std::string::npos) << e;
  EXPECT_NE(e.find("The step was not applied"), std::string::npos) << e;
}

// The same under Megatron's combined 1F1B inside the interleaved schedule (EP2 x PP2 x VPP2, 4 micro-batches: merged
// pairs on both stages): the step runs merged, the locator's re-run one pass at a time, naming the same first place.
TEST(PipelineFaults, NamesTheFirstNonFiniteModuleUnderTheCombinedSchedule) {
  const comm::ProcessGroup w = comm::ProcessGroup::world();
  if (w.size() != 4) GTEST_SKIP() << "runs on 4 ranks";
  testing::NullOut null;
  const std::string place = "the forward output of decoder.layers.0.self_attention (micro-batch 0)";
  train::Trainer pp(
      pp_fault_config(false, {"--init-method-std", "1e30", "--num-layers", "4", "--global-batch-size", "8",
                              "--pipeline-model-parallel-size", "2", "--num-virtual-stages-per-pipeline-rank", "2",
                              "--expert-model-parallel-size", "2", "--bf16", "--moe-token-dispatcher-type", "alltoall",
                              "--overlap-moe-expert-parallel-comm"}),
      null.f, false, &w);
  const std::string e = testing::error_of([&] { pp.train_step(); });
  EXPECT_NE(e.find(place + " on rank 0 (pipeline stage 0)"), std::string::npos) << e;
  EXPECT_NE(e.find("The step was not applied"), std::string::npos) << e;
}

// A NaN in a weight of the last stage only: every rank names that parameter on rank 1, stage 1.
TEST(PipelineFaults, NamesANonFiniteWeightOnTheLastStage) {
  const comm::ProcessGroup w = comm::ProcessGroup::world();
  if (w.size() != 2) GTEST_SKIP() << "runs on 2 ranks";
  testing::NullOut null;
  train::Trainer pp(pp_fault_config(true, {}), null.f, false, &w);
  pp.train_step();
  std::string name;
  for (const auto& p : pp.params().all())
    if (name.empty() && p->name.find("decoder.layers.1.") == 0) name = p->name;
  if (w.rank() == 1) {
    ASSERT_FALSE(name.empty()) << "stage 1 holds layer 1";
    for (const auto& p : pp.params().all())
      if (p->name == name) p->value.set_item(0, std::numeric_limits<double>::quiet_NaN());
  }
  const std::string e = testing::error_of([&] { pp.train_step(); });
  EXPECT_NE(e.find("the parameter decoder.layers.1."), std::string::npos) << e;
  EXPECT_NE(e.find("on rank 1 (pipeline stage 1)"), std::string::npos) << e;
}

}  // namespace
}  // namespace moecore
