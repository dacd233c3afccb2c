// Layout invariance on the GPU (issues 21 and 22): the same tiny job trained on the GPU on one rank and under a
// parallel layout (every rank on the machine's GPU, tensors exchanged through host-staged MPI) gives the one-rank
// losses, gradient norms and aux losses within 1e-5 (f32). Context parallelism too: every --cp-comm-type, CP with EP
// and with PP, and TP2×DP2, hidden and attention dropout on (the masks keyed by global positions, so the same bits
// under any layout). Skipped with a one-line reason where no GPU is visible.
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

struct GpuCpLayout {
  std::string name;
  int64_t world;
  std::vector<std::string> flags;   // the model and run (both runs)
  std::vector<std::string> layout;  // the parallel layout (the multi-rank run)
};

// The CPU's CP layouts' model (tests/mpi/test_cp_layouts.cpp: three layers, GQA with qk-norm, shared expert, aux and
// seq-aux losses, sequences of 32) on the GPU, with Megatron's default dropout.
std::vector<std::string> gpu_cp_base_flags() {
  return train::override_flags(testing::layered_moe_flags(), {"--moe-router-load-balancing-type", "aux_loss",
                                                              "seq_aux_loss", "--moe-aux-loss-coeff", "1e-2", "1e-3"}) +
         testing::mock_run_flags(32, 2, 8, 120, 3, "1e-3") + std::vector<std::string>{"--make-vocab-size-divisible-by",
                                                                                      "64",
                                                                                      "--device",
                                                                                      "cuda",
                                                                                      "--hidden-dropout",
                                                                                      "0.1",
                                                                                      "--attention-dropout",
                                                                                      "0.1"};
}

std::vector<std::string> gpu_cp(int64_t c, const std::string& type = "p2p") {
  return {"--context-parallel-size", std::to_string(c), "--cp-comm-type", type};
}

class GpuCpLayouts : public ::testing::TestWithParam<GpuCpLayout> {};

TEST_P(GpuCpLayouts, MatchOneGpuRankWithDropout) {
  MOE_REQUIRE_GPU();
  const comm::ProcessGroup w = comm::ProcessGroup::world();
  const GpuCpLayout& l = GetParam();
  if (w.size() != l.world) GTEST_SKIP() << l.name << " runs on " << l.world << " ranks";
  const std::vector<std::string> args = train::override_flags(gpu_cp_base_flags(), l.flags);
  testing::expect_same_steps(testing::small_config(args), testing::small_config(args + l.layout), w, 3);
}

INSTANTIATE_TEST_SUITE_P(
    CP, GpuCpLayouts,
    ::testing::Values(
        GpuCpLayout{"CP2_p2p", 2, {}, gpu_cp(2)}, GpuCpLayout{"CP2_a2a", 2, {}, gpu_cp(2, "a2a")},
        GpuCpLayout{"CP2_allgather", 2, {}, gpu_cp(2, "allgather")},
        GpuCpLayout{"CP4_a2a_p2p",
                    4,
                    {},
                    gpu_cp(4, "a2a+p2p") + std::vector<std::string>{"--hierarchical-context-parallel-sizes", "2", "2"}},
        GpuCpLayout{"CP2_EP2", 2, {}, gpu_cp(2) + std::vector<std::string>{"--expert-model-parallel-size", "2"}},
        GpuCpLayout{"CP2_PP2",
                    4,
                    {"--num-layers", "4", "--moe-layer-freq", "[0,1,1,0]"},
                    gpu_cp(2) + std::vector<std::string>{"--pipeline-model-parallel-size", "2"}},
        GpuCpLayout{"TP2_DP2", 4, {}, kGpuTP2}),
    [](const ::testing::TestParamInfo<GpuCpLayout>& i) { return i.param.name; });

}  // namespace
}  // namespace moecore
