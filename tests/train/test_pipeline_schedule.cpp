// The pipeline schedules' order of passes against Megatron's (schedules.py: 1F1B warm-up / steady / cool-down, the
// interleaved schedule table and its micro-batch rules), the even stage split, and the pipeline flags' checks.
#include <gtest/gtest.h>

#include "config_util.h"
#include "moecore/train/pipeline/pipeline_schedule.h"
#include "moecore/train/pipeline/pipeline_stages.h"
#include "test_util.h"

namespace moecore {
namespace {

using testing::error_of;
using testing::operator+;
using testing::user_error_of;
using train::PipelinePass;

PipelinePass F(int64_t m, int64_t c = 0) {
  return {true, m, c};
}
PipelinePass B(int64_t m, int64_t c = 0) {
  return {false, m, c};
}

TEST(PipelineOrder, OneFOneBWarmupSteadyCooldown) {
  // PP4, 8 micro-batches: the first stage runs P-1 = 3 forwards before its first backward.
  EXPECT_EQ(train::pipeline_order(8, 4, 0, 1, 0),
            (std::vector<PipelinePass>{F(0), F(1), F(2), F(3), B(0), F(4), B(1), F(5), B(2), F(6), B(3), F(7), B(4),
                                       B(5), B(6), B(7)}));
  // The last stage alternates from the start.
  EXPECT_EQ(train::pipeline_order(3, 4, 3, 1, 0), (std::vector<PipelinePass>{F(0), B(0), F(1), B(1), F(2), B(2)}));
  // Fewer micro-batches than stages: all forwards, then all backwards.
  EXPECT_EQ(train::pipeline_order(2, 4, 0, 1, 0), (std::vector<PipelinePass>{F(0), F(1), B(0), B(1)}));
}

TEST(PipelineOrder, ScheduleTableIsMegatrons) {
  // Megatron's own example (schedules.py): PP2, N3, M5, VP2.
  const auto t = train::pipeline_schedule_table(5, 2, 3);
  const std::vector<std::pair<int64_t, int64_t>> want = {{0, 0}, {1, 0}, {2, 0}, {0, 1}, {1, 1},
                                                         {2, 1}, {3, 0}, {4, 0}, {3, 1}, {4, 1}};
  EXPECT_EQ(t, want);
}

TEST(PipelineOrder, InterleavedWarmupAndChunkOrder) {
  // PP2, v2, m4 on the first rank: warm-up (P-1)·2 + (v-1)·P = 4 forwards; backwards run the chunks in reverse.
  EXPECT_EQ(train::pipeline_order(4, 2, 0, 2, 0),
            (std::vector<PipelinePass>{F(0, 0), F(1, 0), F(0, 1), F(1, 1), F(2, 0), B(0, 1), F(3, 0), B(1, 1), F(2, 1),
                                       B(0, 0), F(3, 1), B(1, 0), B(2, 1), B(3, 1), B(2, 0), B(3, 0)}));
  // Every rank runs each (micro-batch, chunk) once forward and once backward, the forward first.
  for (int64_t r = 0; r < 4; r++) {
    const auto o = train::pipeline_order(8, 4, r, 3, 0);
    ASSERT_EQ(o.size(), 2u * 8 * 3);
    for (const PipelinePass& p : o) {
      const auto f = std::find(o.begin(), o.end(), F(p.micro_batch, p.chunk));
      const auto b = std::find(o.begin(), o.end(), B(p.micro_batch, p.chunk));
      ASSERT_TRUE(f != o.end() && b != o.end());
      EXPECT_LT(f - o.begin(), b - o.begin());
    }
  }
}

TEST(PipelineOrder, InterleavedMicroBatchRules) {
  EXPECT_NE(error_of([] {
              train::pipeline_order(3, 2, 0, 2, 0);
            }).find("must be a multiple of --pipeline-model-parallel-size 2"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              train::pipeline_order(1, 2, 0, 2, 0);
            }).find("must be a multiple of --pipeline-model-parallel-size 2"),
            std::string::npos);
  EXPECT_NO_THROW(train::pipeline_order(5, 2, 1, 2, 5));  // one group of 5 >= P
}

std::vector<std::string> schedule_pp_flags(const std::vector<std::string>& extra) {
  return train::override_flags(testing::tiny_moe_flags(), {"--num-layers", "8"}) +
         testing::mock_run_flags(16, 2, 8, 96, 2, "1e-3") + extra;
}

TEST(PipelineStages, EvenSplitWithVirtualStages) {
  // PP2 x v2 over 8 layers: rank 0 holds layers 0-1 and 4-5, rank 1 holds 2-3 and 6-7 (Megatron's chunk order).
  const auto c = testing::small_config(
      schedule_pp_flags({"--pipeline-model-parallel-size", "2", "--num-virtual-stages-per-pipeline-rank", "2"}));
  const auto r0 = train::pipeline_stage_layers(c, 0), r1 = train::pipeline_stage_layers(c, 1);
  ASSERT_EQ(r0.size(), 2u);
  EXPECT_EQ(r0[0].first_layer, 0);
  EXPECT_EQ(r0[1].first_layer, 4);
  EXPECT_EQ(r1[0].first_layer, 2);
  EXPECT_EQ(r1[1].first_layer, 6);
  EXPECT_TRUE(r0[0].embedding && !r0[0].loss && !r0[1].embedding && !r0[1].loss);
  EXPECT_TRUE(!r1[0].loss && r1[1].loss && !r1[1].embedding);
  const auto by_layers = testing::small_config(
      schedule_pp_flags({"--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage", "1"}));
  EXPECT_EQ(train::virtual_stages(by_layers), 4);
}

TEST(PipelineFlags, MegatronsChecks) {
  EXPECT_NE(user_error_of([] {
              testing::small_config(schedule_pp_flags({"--pipeline-model-parallel-size", "3"}));
            }).find("--num-layers 8 is not divisible by --pipeline-model-parallel-size 3"),
            std::string::npos);
  EXPECT_NE(user_error_of([] {
              testing::small_config(
                  schedule_pp_flags({"--pipeline-model-parallel-size", "2", "--num-virtual-stages-per-pipeline-rank",
                                     "2", "--num-layers-per-virtual-pipeline-stage", "2"}));
            }).find("give at most one of --num-layers-per-virtual-pipeline-stage"),
            std::string::npos);
  EXPECT_NE(user_error_of([] {
              testing::small_config(schedule_pp_flags({"--num-virtual-stages-per-pipeline-rank", "2"}));
            }).find("need --pipeline-model-parallel-size > 1, got 1"),
            std::string::npos);
  EXPECT_NE(user_error_of([] {
              testing::small_config(
                  schedule_pp_flags({"--pipeline-model-parallel-size", "2", "--num-virtual-stages-per-pipeline-rank",
                                     "2", "--no-overlap-p2p-communication"}));
            }).find("need --pipeline-model-parallel-size > 2, got 2 (with --no-overlap-p2p-communication"),
            std::string::npos);
  EXPECT_NO_THROW(testing::small_config(
      schedule_pp_flags({"--pipeline-model-parallel-size", "4", "--num-virtual-stages-per-pipeline-rank", "2"})));
}

}  // namespace
}  // namespace moecore
