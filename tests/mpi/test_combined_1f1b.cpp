// Megatron's combined 1F1B schedule (--overlap-moe-expert-parallel-comm without --delay-wgrad-compute;
// train/pipeline/combined_1f1b.h) changes when, not what: each layout trained with and without it gives bitwise the
// same losses, aux losses, gradient and parameter norms step by step; and its own trace shows the overlap: every
// all-to-all of one micro-batch is in flight while a sub-step of the other runs, in Megatron's alternation.
#include <gtest/gtest.h>

#include <set>

#include "config_util.h"
#include "moecore/comm/process_group.h"
#include "moecore/nn/substeps.h"
#include "moecore/train/trainer.h"
#include "test_util.h"

namespace moecore {
namespace {

using testing::operator+;

struct CombinedLayout {
  std::string name;
  int64_t world;
  std::vector<std::string> layout;  // both runs
};

// The layout tests' four-layer MoE model (dense, MoE, MoE, dense) over 4 steps, alltoall, bf16, 4 micro-batches of 2
// on every data-parallel rank, the parameter norm logged (compared too).
std::vector<std::string> combined_base_flags(int64_t dp) {
  return testing::four_layer_moe_flags(4) +
         std::vector<std::string>{
             "--moe-token-dispatcher-type", "alltoall", "--bf16", "--log-params-norm", "--global-batch-size",
             std::to_string(8 * dp)};
}

const std::vector<std::string> kCombined{"--overlap-moe-expert-parallel-comm"};

class Combined1F1BLayouts : public ::testing::TestWithParam<CombinedLayout> {};

TEST_P(Combined1F1BLayouts, BitwiseSameAsThePlainSchedule) {
  const comm::ProcessGroup w = comm::ProcessGroup::world();
  const CombinedLayout& l = GetParam();
  if (w.size() != l.world) GTEST_SKIP() << l.name << " runs on " << l.world << " ranks";
  const std::vector<std::string> args = combined_base_flags(l.world) + l.layout;
  std::FILE* null = std::fopen("/dev/null", "w");
  {
    train::Trainer plain(testing::small_config(args), null, false, &w);
    train::Trainer combined(testing::small_config(args + kCombined), null, false, &w);
    for (int step = 0; step < 4; step++) {
      const train::StepResult a = plain.train_step(), b = combined.train_step();
      EXPECT_EQ(a.lm_loss, b.lm_loss) << "step " << step;
      EXPECT_EQ(a.grad_norm, b.grad_norm) << "step " << step;
      EXPECT_EQ(a.aux_losses, b.aux_losses) << "step " << step;
      EXPECT_EQ(a.z_loss, b.z_loss) << "step " << step;
      EXPECT_NE(a.params_norm, 0.0);
      EXPECT_EQ(a.params_norm, b.params_norm) << "step " << step;
    }
  }
  std::fclose(null);
}

const std::vector<std::string> kEP2{"--expert-model-parallel-size", "2"};
const std::vector<std::string> kEP4{"--expert-model-parallel-size", "4"};

INSTANTIATE_TEST_SUITE_P(
    Combined, Combined1F1BLayouts,
    ::testing::Values(
        CombinedLayout{"EP2", 2, kEP2}, CombinedLayout{"EP4", 4, kEP4},
        // Selective recompute of what Megatron allows beside the flag (not moe, not full).
        CombinedLayout{"EP2RecomputeSelective", 2,
                       kEP2 + std::vector<std::string>{"--recompute-granularity", "selective", "--recompute-modules",
                                                       "layernorm", "moe_act", "shared_experts"}},
        CombinedLayout{
            "EP2SharedExperts", 2,
            kEP2 + std::vector<std::string>{"--moe-shared-expert-intermediate-size", "32", "--moe-shared-expert-gate"}},
        CombinedLayout{"EP2Dropout", 2,
                       kEP2 + std::vector<std::string>{"--hidden-dropout", "0.1", "--attention-dropout", "0.1"}},
        CombinedLayout{"EP2PerTokenLoss", 2, kEP2 + std::vector<std::string>{"--calculate-per-token-loss"}},
        CombinedLayout{"EP2Flex", 2, kEP2 + std::vector<std::string>{"--moe-token-dispatcher-type", "flex"}},
        CombinedLayout{"DP2xEP2DistOptOverlapGrads", 4,
                       kEP2 + std::vector<std::string>{"--use-distributed-optimizer", "--overlap-grad-reduce",
                                                       "--overlap-param-gather", "--ddp-bucket-size", "1500"}}),
    [](const auto& info) { return info.param.name; });

// The schedule's own trace over one step at EP2 (alltoall and flex): micro-batch m's forward alternates with m−1's
// backward at every sub-step boundary, and each all-to-all posted by one is in flight while the other's next
// sub-step runs.
class Combined1F1BTrace : public ::testing::TestWithParam<std::string> {};

TEST_P(Combined1F1BTrace, AllToAllsInFlightWhileTheOtherMicroBatchComputes) {
  const comm::ProcessGroup w = comm::ProcessGroup::world();
  if (w.size() != 2) GTEST_SKIP() << "runs on 2 ranks";
  std::FILE* null = std::fopen("/dev/null", "w");
  {
    const std::vector<std::string> dispatcher{"--moe-token-dispatcher-type", GetParam()};
    train::Trainer t(testing::small_config(combined_base_flags(2) + kEP2 + kCombined + dispatcher), null, false, &w);
    nn::SubSteps::set_tracing(true);
    t.train_step();
    nn::SubSteps::set_tracing(false);
    const std::vector<nn::SubStepRecord> trace = nn::SubSteps::take_trace();
    // 4 micro-batches: 3 merged pairs; each pair: 2 MoE layers × (2 forward + 2 backward boundaries).
    ASSERT_EQ(trace.size(), 3u * 2 * 4);
    std::set<std::string> hidden;  // the all-to-alls seen in flight under the other micro-batch's sub-step
    for (size_t i = 0; i < trace.size(); i++) {
      const nn::SubStepRecord& r = trace[i];
      const int64_t pair = static_cast<int64_t>(i / 8);  // forward of pair+1, backward of pair
      EXPECT_EQ(r.micro_batch, r.forward ? pair + 1 : pair) << i;
      EXPECT_EQ(r.forward, i % 2 == 1) << i;  // alternating, backward first
      bool other = false;
      for (const auto& f : r.in_flight) {
        if (f.micro_batch == r.micro_batch) continue;
        other = true;
        EXPECT_NE(f.forward, r.forward);
        hidden.insert(std::string(f.forward ? "f:" : "b:") + nn::a2a_name(f.kind));
      }
      // The pair's last sub-step (the forward's last combine wait) begins after the backward ended.
      if (i % 8 != 7)
        EXPECT_TRUE(other) << i << ": " << r.layer << " " << r.step << " began with no all-to-all of micro-batch "
                           << (r.forward ? pair : pair + 1) << " in flight";
      else
        EXPECT_FALSE(other) << i;
    }
    EXPECT_EQ(hidden, (std::set<std::string>{"b:combine-backward", "b:dispatch-backward", "f:combine", "f:dispatch"}));
    // Megatron's layer pairing: forward layer i beside backward layer L−1−i (the MoE layers 1 and 2 here).
    EXPECT_EQ(trace[0].layer, "decoder.layers.2.mlp");
    EXPECT_EQ(trace[0].step, "combine-backward wait + experts backward");
    EXPECT_EQ(trace[1].layer, "decoder.layers.1.mlp");
    EXPECT_EQ(trace[1].step, "dispatch wait + experts");
  }
  std::fclose(null);
}

INSTANTIATE_TEST_SUITE_P(Combined, Combined1F1BTrace, ::testing::Values("alltoall", "flex"));

}  // namespace
}  // namespace moecore
