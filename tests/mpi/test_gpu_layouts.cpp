// Layout invariance on the GPU (issues 21 and 22): the same tiny job trained on the GPU on one rank and under a
// parallel layout (every rank on the machine's GPU, tensors exchanged through host-staged MPI) gives the one-rank
// losses, gradient norms and aux losses within 1e-5 (f32). Skipped with a one-line reason where no GPU is visible.
#include <gtest/gtest.h>

#include "config_util.h"
#include "cuda/gpu_util.h"
#include "layout_util.h"
#include "moecore/comm/process_group.h"
#include "moecore/train/trainer.h"

namespace moecore {
namespace {

using testing::operator+;

struct GpuLayout {
  std::string name;
  int64_t world;
  bool moe;
  std::vector<std::string> flags;
};

class GpuLayouts : public ::testing::TestWithParam<GpuLayout> {};

TEST_P(GpuLayouts, MatchOneGpuRank) {
  MOE_REQUIRE_GPU();
  const comm::ProcessGroup w = comm::ProcessGroup::world();
  const GpuLayout& l = GetParam();
  if (w.size() != l.world) GTEST_SKIP() << l.name << " runs on " << l.world << " ranks";
  // Dense: the layered model's attention (GQA, qk-norm, untied output) with a SwiGLU MLP; MoE: the tiny MoE model
  // with a shared expert, aux and z losses.
  std::vector<std::string> model =
      l.moe ? testing::tiny_moe_flags() + std::vector<std::string>{"--moe-aux-loss-coeff",
                                                                   "1e-2",
                                                                   "--moe-z-loss-coeff",
                                                                   "1e-3",
                                                                   "--moe-shared-expert-intermediate-size",
                                                                   "32"}
            : std::vector<std::string>{"--num-layers",
                                       "2",
                                       "--hidden-size",
                                       "64",
                                       "--num-attention-heads",
                                       "4",
                                       "--group-query-attention",
                                       "--num-query-groups",
                                       "2",
                                       "--qk-layernorm",
                                       "--untie-embeddings-and-output-weights",
                                       "--swiglu",
                                       "--disable-bias-linear",
                                       "--ffn-hidden-size",
                                       "96"} +
                  testing::rmsnorm_rope_flags();
  const std::vector<std::string> args =
      model + testing::mock_run_flags(32, 2, 8, 128, 5, "1e-3") +
      // One padded vocabulary (128) on one rank and under TP2, whose default padding is to a multiple of 256.
      std::vector<std::string>{"--device", "cuda", "--make-vocab-size-divisible-by", "64"};
  testing::expect_same_steps(testing::small_config(args), testing::small_config(args, l.flags), w);
}

const std::vector<std::string> kGpuTP2{"--tensor-model-parallel-size", "2", "--sequence-parallel"};

INSTANTIATE_TEST_SUITE_P(
    Layouts, GpuLayouts,
    ::testing::Values(
        GpuLayout{"Dense_DP2", 2, false, {}}, GpuLayout{"Dense_DP2_DistOpt", 2, false, {"--use-distributed-optimizer"}},
        GpuLayout{"Dense_TP2_SP", 2, false, kGpuTP2},
        GpuLayout{"Dense_PP2", 2, false, {"--pipeline-model-parallel-size", "2"}},
        GpuLayout{"MoE_PP2", 2, true, {"--pipeline-model-parallel-size", "2"}},
        GpuLayout{"MoE_EP2", 2, true, {"--expert-model-parallel-size", "2"}},
        GpuLayout{"MoE_EP2_DistOpt_Overlap",
                  2,
                  true,
                  {"--expert-model-parallel-size", "2", "--use-distributed-optimizer", "--moe-shared-expert-overlap"}},
        GpuLayout{"MoE_EP2_allgather",
                  2,
                  true,
                  {"--expert-model-parallel-size", "2", "--moe-token-dispatcher-type", "allgather"}},
        GpuLayout{"MoE_TP2_SP_EP2", 4, true, kGpuTP2 + std::vector<std::string>{"--expert-model-parallel-size", "2"}}),
    [](const ::testing::TestParamInfo<GpuLayout>& i) { return i.param.name; });

}  // namespace
}  // namespace moecore
