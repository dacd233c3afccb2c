// Megatron's combined 1F1B schedule inside the interleaved pipeline schedule (--overlap-moe-expert-parallel-comm
// without --delay-wgrad-compute under --pipeline-model-parallel-size 2 or 4 with two virtual stages;
// pipeline_schedule.h): each layout trained with and without it gives bitwise the same losses, aux losses, gradient
// and parameter norms step by step, and the one-rank run's within 1e-5, with micro-batch counts that are and are not
// multiples of PP (one where the first stage runs every forward in its warm-up); a resume continues bitwise; its
// trace shows each MoE all-to-all of one micro-batch in flight while the other micro-batch's layer computes, on both
// stages.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <set>

#include "config_util.h"
#include "layout_util.h"
#include "moecore/comm/process_group.h"
#include "moecore/nn/substeps.h"
#include "moecore/train/pipeline/pipeline_schedule.h"
#include "moecore/train/trainer.h"
#include "test_util.h"

namespace moecore {
namespace {

using testing::operator+;

struct CombinedPipelineLayout {
  std::string name;
  int64_t world;
  int64_t micro_batches;            // per data-parallel rank
  std::vector<std::string> layout;  // beside EP2 x PP2 x VPP2 (both multi-rank runs)
  std::vector<std::string> model;   // the model's extra flags (every run)
  int64_t pp = 2;                   // the layout's --pipeline-model-parallel-size (given in `layout` when not 2)
};

// The layout tests' four-layer MoE model (dense, MoE, MoE, dense: each virtual stage one layer), alltoall, bf16,
// micro-batches of 2, the parameter norm logged (compared too).
std::vector<std::string> combined_pipeline_model(int64_t global_batch, const std::vector<std::string>& extra) {
  return train::override_flags(
      train::override_flags(testing::four_layer_moe_flags(3), {"--global-batch-size", std::to_string(global_batch)}) +
          std::vector<std::string>{"--moe-token-dispatcher-type", "alltoall", "--bf16", "--log-params-norm"},
      extra);
}

const std::vector<std::string> kCombinedEP2PP2VPP2{"--expert-model-parallel-size",           "2",
                                                   "--pipeline-model-parallel-size",         "2",
                                                   "--num-virtual-stages-per-pipeline-rank", "2"};
const std::vector<std::string> kCombinedFlag{"--overlap-moe-expert-parallel-comm"};

class Combined1F1BPipeline : public ::testing::TestWithParam<CombinedPipelineLayout> {};

TEST_P(Combined1F1BPipeline, BitwiseSameAsThePlainInterleavedScheduleAndNearOneRank) {
  const comm::ProcessGroup w = comm::ProcessGroup::world();
  const CombinedPipelineLayout& l = GetParam();
  if (w.size() != l.world) GTEST_SKIP() << l.name << " runs on " << l.world << " ranks";
  const int64_t dp = l.world / l.pp;  // the dense layers' data parallelism beside PP (EP folds into it)
  const std::vector<std::string> model = combined_pipeline_model(2 * l.micro_batches * dp, l.model);
  const std::vector<std::string> layout = train::override_flags(kCombinedEP2PP2VPP2, l.layout);
  std::FILE* null = std::fopen("/dev/null", "w");
  {
    // One rank: no expert parallelism, so the alltoall dispatcher (flex needs EP > 1; the same math).
    train::Trainer single(testing::small_config(model, {"--moe-token-dispatcher-type", "alltoall"}), null, false,
                          nullptr);
    train::Trainer plain(testing::small_config(model + layout), null, false, &w);
    train::Trainer combined(testing::small_config(model + layout + kCombinedFlag), null, false, &w);
    for (int step = 0; step < 3; step++) {
      const train::StepResult one = single.train_step(), a = plain.train_step(), b = combined.train_step();
      EXPECT_EQ(a.lm_loss, b.lm_loss) << "step " << step;
      EXPECT_EQ(a.grad_norm, b.grad_norm) << "step " << step;
      EXPECT_EQ(a.aux_losses, b.aux_losses) << "step " << step;
      EXPECT_EQ(a.z_loss, b.z_loss) << "step " << step;
      EXPECT_NE(a.params_norm, 0.0);
      EXPECT_EQ(a.params_norm, b.params_norm) << "step " << step;
      testing::expect_same_step(one, b, step, 1e-5);
    }
  }
  std::fclose(null);
}

INSTANTIATE_TEST_SUITE_P(
    Combined, Combined1F1BPipeline,
    ::testing::Values(
        CombinedPipelineLayout{"EP2xPP2VPP2M4", 4, 4, {}, {}}, CombinedPipelineLayout{"EP2xPP2VPP2M6", 4, 6, {}, {}},
        // Not multiples of PP (Megatron's groups: 3 then 2 micro-batches; one group of 5).
        CombinedPipelineLayout{
            "EP2xPP2VPP2M5Group3", 4, 5, {"--microbatch-group-size-per-virtual-pipeline-stage", "3"}, {}},
        CombinedPipelineLayout{
            "EP2xPP2VPP2M5Group5", 4, 5, {"--microbatch-group-size-per-virtual-pipeline-stage", "5"}, {}},
        // The first stage's warm-up takes every forward (no merged pair there); the second merges two pairs.
        CombinedPipelineLayout{
            "EP2xPP2VPP2M3Group3", 4, 3, {"--microbatch-group-size-per-virtual-pipeline-stage", "3"}, {}},
        // Selective recompute of what Megatron allows beside the flag (not moe, not full).
        CombinedPipelineLayout{
            "EP2xPP2VPP2RecomputeSelective",
            4,
            4,
            {},
            {"--recompute-granularity", "selective", "--recompute-modules", "layernorm", "moe_act", "shared_experts"}},
        CombinedPipelineLayout{"EP2xPP2VPP2SharedExperts",
                               4,
                               4,
                               {},
                               {"--moe-shared-expert-intermediate-size", "32", "--moe-shared-expert-gate"}},
        CombinedPipelineLayout{"EP2xPP2VPP2Flex", 4, 4, {}, {"--moe-token-dispatcher-type", "flex"}},
        CombinedPipelineLayout{"EP2xPP2VPP2DropoutPerTokenLoss",
                               4,
                               4,
                               {},
                               {"--hidden-dropout", "0.1", "--attention-dropout", "0.1", "--calculate-per-token-loss"}},
        // 8 ranks (CTest mpi_tests_8_ranks): each stage's 4 ranks are DP4 for the dense layers, EP2 x DP2 for the
        // experts, with the distributed optimizer overlapping its reductions.
        CombinedPipelineLayout{"EP2xPP2VPP2xDP4DistOpt",
                               8,
                               4,
                               {"--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather"},
                               {}},
        // 8 ranks: four stages (eight layers, all MoE), 4 micro-batches, and 6 in one group (not a multiple of PP).
        CombinedPipelineLayout{"EP2xPP4VPP2M4",
                               8,
                               4,
                               {"--pipeline-model-parallel-size", "4"},
                               {"--num-layers", "8", "--moe-layer-freq", "1"},
                               4},
        CombinedPipelineLayout{
            "EP2xPP4VPP2M6Group6",
            8,
            6,
            {"--pipeline-model-parallel-size", "4", "--microbatch-group-size-per-virtual-pipeline-stage", "6"},
            {"--num-layers", "8", "--moe-layer-freq", "1"},
            4}),
    [](const auto& info) { return info.param.name; });

// A save and resume under the combined schedule continues bitwise (EP2 x PP2 x VPP2, 4 micro-batches).
TEST(Combined1F1BPipelineResume, ResumeIsBitwise) {
  const comm::ProcessGroup w = comm::ProcessGroup::world();
  if (w.size() != 4) GTEST_SKIP() << "runs on 4 ranks";
  const std::string dir = testing::mpi_shared_dir(w, "combined_resume");
  testing::expect_bitwise_resume(
      [&](const std::vector<std::string>& extra) {
        return testing::small_config(train::override_flags(combined_pipeline_model(16, {}), {"--train-iters", "5"}) +
                                         kCombinedEP2PP2VPP2 + kCombinedFlag,
                                     extra);
      },
      dir, w);
  w.barrier();
  if (w.rank() == 0) std::filesystem::remove_all(dir);
}

// The schedule's own trace over one step on each stage, every layer an MoE layer (each virtual stage one): inside
// each merged pair the backward and the forward alternate at every sub-step boundary, backward first, on different
// micro-batches, and each all-to-all posted by one is in flight while the other's next sub-step runs.
TEST(Combined1F1BPipelineTrace, AllToAllsInFlightWhileTheOtherMicroBatchComputes) {
  const comm::ProcessGroup w = comm::ProcessGroup::world();
  if (w.size() != 4) GTEST_SKIP() << "runs on 4 ranks";
  const int64_t m = 4;
  std::FILE* null = std::fopen("/dev/null", "w");
  {
    const std::vector<std::string> flags =
        train::override_flags(combined_pipeline_model(2 * m * 2, {}), {"--moe-layer-freq", "1"}) + kCombinedEP2PP2VPP2 +
        kCombinedFlag;
    train::Trainer t(testing::small_config(flags), null, false, &w);
    ASSERT_NE(t.pipeline(), nullptr);
    const int64_t pp_rank = w.rank() / 2;
    int64_t pairs = 0;
    for (const train::PipelinePass& p : train::pipeline_order(m, 2, pp_rank, 2, 0, false, true)) pairs += p.merged;
    EXPECT_EQ(pairs, pp_rank == 0 ? 3 : 5);  // 8 passes each way less the warm-up, 2·(P−1−r) + (v−1)·P + 1
    nn::SubSteps::set_tracing(true);
    t.train_step();
    nn::SubSteps::set_tracing(false);
    const std::vector<nn::SubStepRecord> trace = nn::SubSteps::take_trace();
    // Each pair: one MoE layer forward (2 boundaries) beside one backward (2 boundaries).
    ASSERT_EQ(static_cast<int64_t>(trace.size()), 4 * pairs);
    std::set<std::string> hidden;  // the all-to-alls seen in flight under the other micro-batch's sub-step
    for (size_t i = 0; i < trace.size(); i++) {
      const nn::SubStepRecord& r = trace[i];
      bool other = false;
      for (const auto& f : r.in_flight) {
        if (f.micro_batch == r.micro_batch) continue;
        other = true;
        EXPECT_NE(f.forward, r.forward);
        hidden.insert(std::string(f.forward ? "f:" : "b:") + nn::a2a_name(f.kind));
      }
      // Each pair's first record: the backward's combine-backward all-to-all was posted before the forward's first
      // sub-step (attention, router, permute) ran, and is waited for only now.
      if (i % 4 == 0) {
        EXPECT_TRUE(std::any_of(r.in_flight.begin(), r.in_flight.end(), [&](const auto& f) {
          return f.micro_batch == r.micro_batch && f.kind == nn::A2A::CombineBackward;
        })) << i;
      }
      // The pair's last sub-step (the forward's combine wait) begins after the backward ended.
      if (i % 4 != 3)
        EXPECT_TRUE(other) << "rank " << w.rank() << " record " << i << ": " << r.layer << " " << r.step
                           << " began with no all-to-all of the other micro-batch in flight";
      else
        EXPECT_FALSE(other) << i;
    }
    // With one MoE layer per chunk the backward's combine-backward is hidden under the forward's first sub-step,
    // which begins the pair rather than at a boundary (checked above).
    EXPECT_EQ(hidden, (std::set<std::string>{"b:dispatch-backward", "f:combine", "f:dispatch"}));
  }
  std::fclose(null);
}

}  // namespace
}  // namespace moecore
