// Megatron's communication overlaps change when, not what: each layout trained with and without the overlap flags
// (--overlap-grad-reduce, --overlap-param-gather, --overlap-param-gather-with-optimizer-step,
// --overlap-moe-expert-parallel-comm with --delay-wgrad-compute, --overlap-dispatch-backward-with-experts-wgrad)
// gives bitwise the same losses, aux losses and gradient norms step by step; the overlap is seen to happen (the
// reductions start in backward, the parameter all-gathers stay in flight after the step); and the flags follow
// Megatron's validation rules, with moecore's one refusal named (the combined 1F1B schedule under pipelining).
#include <gtest/gtest.h>

#include "config_util.h"
#include "cuda/gpu_util.h"
#include "layout_util.h"
#include "moecore/comm/process_group.h"
#include "moecore/train/trainer.h"
#include "test_util.h"

namespace moecore {
namespace {

using testing::operator+;

struct OverlapLayout {
  std::string name;
  int64_t world;
  std::vector<std::string> layout;   // the parallel layout and optimizer (both runs)
  std::vector<std::string> overlap;  // the overlap flags (the second run)
};

// The layout tests' four-layer MoE model (config_util.h) over 4 steps, with the alltoall dispatcher.
std::vector<std::string> overlap_base_flags() {
  return testing::four_layer_moe_flags(4) + std::vector<std::string>{"--moe-token-dispatcher-type", "alltoall"};
}

class OverlapLayouts : public ::testing::TestWithParam<OverlapLayout> {};

TEST_P(OverlapLayouts, BitwiseSameWithAndWithoutOverlap) {
  const comm::ProcessGroup w = comm::ProcessGroup::world();
  const OverlapLayout& l = GetParam();
  if (w.size() != l.world) GTEST_SKIP() << l.name << " runs on " << l.world << " ranks";
  const std::vector<std::string> args = overlap_base_flags() + l.layout;
  std::FILE* null = std::fopen("/dev/null", "w");
  {
    train::Trainer plain(testing::small_config(args), null, false, &w);
    train::Trainer overlapped(testing::small_config(args + l.overlap), null, false, &w);
    for (int step = 0; step < 4; step++) {
      const train::StepResult a = plain.train_step(), b = overlapped.train_step();
      EXPECT_EQ(a.lm_loss, b.lm_loss) << "step " << step;
      EXPECT_EQ(a.grad_norm, b.grad_norm) << "step " << step;
      EXPECT_EQ(a.aux_losses, b.aux_losses) << "step " << step;
      EXPECT_EQ(a.z_loss, b.z_loss) << "step " << step;
      EXPECT_EQ(a.params_norm, b.params_norm) << "step " << step;
    }
  }
  std::fclose(null);
}

const std::vector<std::string> kOverlapGradReduce{"--overlap-grad-reduce"};
const std::vector<std::string> kOverlapGradAndParam{"--overlap-grad-reduce", "--overlap-param-gather"};
const std::vector<std::string> kOverlapExperts{"--overlap-moe-expert-parallel-comm", "--delay-wgrad-compute"};
// Several buckets per optimizer (each closed at ~1500 elements). Without a parameter norm to log, every parameter
// all-gather of --overlap-param-gather is waited in the next forward's pre-hooks.
const std::vector<std::string> kOverlapDistOpt{"--use-distributed-optimizer", "--ddp-bucket-size", "1500"};
const std::vector<std::string> kOverlapParamsNorm{"--log-params-norm"};  // the step completes the gathers for it
const std::vector<std::string> kOverlapEP2Bf16{"--expert-model-parallel-size", "2", "--bf16"};
const std::vector<std::string> kOverlapPP2{"--pipeline-model-parallel-size", "2"};
const std::vector<std::string> kOverlapVPP2{"--pipeline-model-parallel-size", "2",
                                            "--num-virtual-stages-per-pipeline-rank", "2"};

INSTANTIATE_TEST_SUITE_P(
    Overlap, OverlapLayouts,
    ::testing::Values(
        OverlapLayout{"DP2Replicated", 2, {"--ddp-bucket-size", "1500"}, kOverlapGradReduce},
        OverlapLayout{"DP2DistOptGradReduce", 2, kOverlapDistOpt, kOverlapGradReduce},
        OverlapLayout{"DP2DistOptParamGather", 2, kOverlapDistOpt, kOverlapGradAndParam},
        OverlapLayout{"DP2DistOptParamGatherParamsNorm", 2, kOverlapDistOpt + kOverlapParamsNorm, kOverlapGradAndParam},
        OverlapLayout{"DP2DistOptOneBucketPerLayer", 2, {"--use-distributed-optimizer"}, kOverlapGradAndParam},
        OverlapLayout{"EP2DelayWgrad", 2, kOverlapEP2Bf16, kOverlapExperts},
        OverlapLayout{
            "EP2DispatchBackwardWgrad", 2, kOverlapEP2Bf16, {"--overlap-dispatch-backward-with-experts-wgrad"}},
        OverlapLayout{"EP2DistOptEverything", 2, kOverlapEP2Bf16 + kOverlapDistOpt,
                      kOverlapExperts + kOverlapGradAndParam},
        OverlapLayout{"DP4DistOptParamGather", 4, kOverlapDistOpt, kOverlapGradAndParam},
        OverlapLayout{"DP2xEP2DistOptEverything", 4, kOverlapEP2Bf16 + kOverlapDistOpt,
                      kOverlapExperts + kOverlapGradAndParam},
        OverlapLayout{"PP2xDP2DistOpt", 4, kOverlapPP2 + kOverlapDistOpt, kOverlapGradAndParam},
        OverlapLayout{"PP2InterleavedxDP2ParamGatherWithStep", 4,
                      kOverlapVPP2 + kOverlapDistOpt + std::vector<std::string>{"--ckpt-format", "torch"},
                      kOverlapGradAndParam + std::vector<std::string>{"--overlap-param-gather-with-optimizer-step"}},
        OverlapLayout{"PP2InterleavedxEP2DelayWgrad", 4, kOverlapVPP2 + kOverlapEP2Bf16, kOverlapExperts}),
    [](const auto& info) { return info.param.name; });

// The same on the GPU (every rank on the machine's GPU, host-staged MPI; skipped without one): the delayed expert
// weight gradients of the GPU's grouped GEMMs and the distributed optimizer's gathers left to the next forward
// change no bit. In f32: the EP overlap of --delay-wgrad-compute needs --bf16, so its per-layer twin
// --overlap-dispatch-backward-with-experts-wgrad is the flag here.
TEST(OverlapGpu, BitwiseSameWithAndWithoutOverlap) {
  MOE_REQUIRE_GPU();
  const comm::ProcessGroup w = comm::ProcessGroup::world();
  if (w.size() != 2) GTEST_SKIP() << "runs on 2 ranks";
  const std::vector<std::string> args =
      overlap_base_flags() + kOverlapDistOpt +
      std::vector<std::string>{"--expert-model-parallel-size", "2", "--device", "cuda"};
  std::FILE* null = std::fopen("/dev/null", "w");
  {
    train::Trainer plain(testing::small_config(args), null, false, &w);
    train::Trainer overlapped(
        testing::small_config(args + kOverlapGradAndParam +
                              std::vector<std::string>{"--overlap-dispatch-backward-with-experts-wgrad"}),
        null, false, &w);
    for (int step = 0; step < 4; step++) {
      const train::StepResult a = plain.train_step(), b = overlapped.train_step();
      EXPECT_EQ(a.lm_loss, b.lm_loss) << "step " << step;
      EXPECT_EQ(a.grad_norm, b.grad_norm) << "step " << step;
      EXPECT_EQ(a.aux_losses, b.aux_losses) << "step " << step;
    }
  }
  std::fclose(null);
}

// The overlap happens: with --overlap-grad-reduce every bucket's reduction starts inside backward (none is left to
// finish_gradients), without it none does; with --overlap-param-gather the step returns with its buckets'
// all-gathers in flight, and the next forward completes them (but for a parameter norm to log, which the step
// completes them for).
TEST(OverlapHappens, ReductionsStartInBackwardAndGathersStayInFlight) {
  const comm::ProcessGroup w = comm::ProcessGroup::world();
  if (w.size() != 2) GTEST_SKIP() << "runs on 2 ranks";
  const std::vector<std::string> args = overlap_base_flags() + kOverlapDistOpt;
  std::FILE* null = std::fopen("/dev/null", "w");
  {
    train::Trainer plain(testing::small_config(args), null, false, &w);
    train::Trainer overlapped(testing::small_config(args + kOverlapGradAndParam), null, false, &w);
    train::Trainer with_norm(testing::small_config(args + kOverlapGradAndParam + kOverlapParamsNorm), null, false, &w);
    for (int step = 0; step < 2; step++) {
      plain.train_step();
      EXPECT_EQ(plain.optimizer().reductions_started_in_backward(), 0u) << "step " << step;
      EXPECT_EQ(plain.optimizer().param_gathers_pending(), 0u) << "step " << step;
      overlapped.train_step();
      EXPECT_GE(overlapped.optimizer().reductions_started_in_backward(), 4u) << "step " << step;
      EXPECT_GE(overlapped.optimizer().param_gathers_pending(), 4u) << "step " << step;
      with_norm.train_step();
      EXPECT_EQ(with_norm.optimizer().reductions_started_in_backward(),
                overlapped.optimizer().reductions_started_in_backward());
      EXPECT_EQ(with_norm.optimizer().param_gathers_pending(), 0u) << "--log-params-norm completes them";
    }
    overlapped.model().logits(Tensor::zeros({1, 16}, DType::I64));  // a forward waits for every bucket
    EXPECT_EQ(overlapped.optimizer().param_gathers_pending(), 0u);
  }
  std::fclose(null);
}

// Megatron's rules (arguments.py, TransformerConfig), named; moecore's refusal of the two-micro-batch EP schedule.
TEST(OverlapFlags, MegatronValidation) {
  const std::vector<std::string> base = overlap_base_flags();
  auto error = [&](const std::vector<std::string>& extra) {
    return testing::error_of([&] { testing::small_config(base, extra); });
  };
  EXPECT_TRUE(testing::contains(error({"--overlap-param-gather", "--overlap-grad-reduce"}),
                                "--overlap-param-gather only supported with distributed optimizer"));
  EXPECT_TRUE(testing::contains(error({"--overlap-param-gather", "--use-distributed-optimizer"}),
                                "Must use --overlap-param-gather with --overlap-grad-reduce"));
  EXPECT_TRUE(testing::contains(error(kOverlapDistOpt + kOverlapGradAndParam +
                                      std::vector<std::string>{"--overlap-param-gather-with-optimizer-step"}),
                                "only supported with interleaved pipeline parallelism"));
  EXPECT_TRUE(testing::contains(error(kOverlapVPP2 + kOverlapDistOpt + kOverlapGradAndParam +
                                      std::vector<std::string>{"--overlap-param-gather-with-optimizer-step"}),
                                "--ckpt-format torch"));
  EXPECT_TRUE(testing::contains(
      error(kOverlapGradReduce + std::vector<std::string>{"--overlap-param-gather-with-optimizer-step"}),
      "only supported with distributed optimizer"));
  EXPECT_TRUE(testing::contains(error(kOverlapExperts + std::vector<std::string>{"--bf16"}),
                                "only supported with expert model parallelism"));
  EXPECT_TRUE(testing::contains(
      error(kOverlapExperts + kOverlapEP2Bf16 + std::vector<std::string>{"--moe-token-dispatcher-type", "allgather"}),
      "alltoall or flex token dispatcher"));
  EXPECT_TRUE(testing::contains(error(kOverlapExperts + std::vector<std::string>{"--expert-model-parallel-size", "2"}),
                                "only supported with a bf16 or fp16 model"));
  EXPECT_TRUE(testing::contains(error(kOverlapExperts + kOverlapEP2Bf16 + kOverlapPP2),
                                "virtual pipeline stages must be specified"));
  EXPECT_TRUE(testing::contains(error(kOverlapExperts + kOverlapEP2Bf16 +
                                      std::vector<std::string>{"--recompute-granularity", "full", "--recompute-method",
                                                               "uniform", "--recompute-num-layers", "1"}),
                                "disable full recomputation"));
  EXPECT_TRUE(testing::contains(
      error(kOverlapExperts + kOverlapEP2Bf16 +
            std::vector<std::string>{"--recompute-granularity", "selective", "--recompute-modules", "moe"}),
      "disable moe in --recompute-modules"));
  EXPECT_TRUE(testing::contains(
      error(kOverlapExperts + kOverlapEP2Bf16 + std::vector<std::string>{"--moe-shared-expert-overlap"}),
      "disable --moe-shared-expert-overlap"));
  EXPECT_TRUE(
      testing::contains(error({"--delay-wgrad-compute"}),
                        "--overlap-moe-expert-parallel-comm must be enabled when enabling --delay-wgrad-compute"));
  // Megatron's combined 1F1B schedule (without --delay-wgrad-compute) runs without pipelining
  // (test_combined_1f1b.cpp) and inside the interleaved pipeline schedule (test_combined_1f1b_pipeline.cpp); under
  // the non-interleaved 1F1B (no virtual stages, or one) Megatron's assertion refuses it, with or without
  // --delay-wgrad-compute, naming the flags that add virtual stages.
  const std::vector<std::string> combined{"--overlap-moe-expert-parallel-comm"};
  EXPECT_EQ(error(kOverlapEP2Bf16 + combined), "");
  EXPECT_EQ(error(kOverlapEP2Bf16 + kOverlapVPP2 + combined), "");
  for (const auto& pp :
       {kOverlapPP2, kOverlapPP2 + std::vector<std::string>{"--num-virtual-stages-per-pipeline-rank", "1"}})
    for (const auto& delay : {std::vector<std::string>{}, std::vector<std::string>{"--delay-wgrad-compute"}}) {
      const std::string e = error(kOverlapEP2Bf16 + pp + combined + delay);
      EXPECT_TRUE(testing::contains(e,
                                    "virtual pipeline stages must be specified when --pipeline-model-parallel-size "
                                    "2 > 1 (Megatron's rule; --delay-wgrad-compute does not lift it)"))
          << e;
      EXPECT_TRUE(
          testing::contains(e, "add --num-layers-per-virtual-pipeline-stage or --num-virtual-stages-per-pipeline-rank"))
          << e;
    }
  // Megatron's combined schedule for interleaving asserts no Megatron FSDP.
  EXPECT_TRUE(testing::contains(
      error(kOverlapEP2Bf16 + kOverlapVPP2 + combined + std::vector<std::string>{"--use-megatron-fsdp"}),
      "with FSDP is not supported for interleaved pipeline parallelism"));
  EXPECT_TRUE(testing::contains(error(kOverlapExperts + kOverlapEP2Bf16 +
                                      std::vector<std::string>{"--overlap-dispatch-backward-with-experts-wgrad"}),
                                "must be disabled when enabling --overlap-dispatch-backward-with-experts-wgrad"));
  // Accepted: what the layouts above train.
  EXPECT_EQ(error(kOverlapGradReduce), "");
  EXPECT_EQ(error(kOverlapDistOpt + kOverlapGradAndParam), "");
  EXPECT_EQ(error(kOverlapExperts + kOverlapEP2Bf16), "");
  EXPECT_EQ(error(kOverlapExperts + kOverlapEP2Bf16 + kOverlapVPP2), "");
}

}  // namespace
}  // namespace moecore
