// Layout invariance of Multi-Latent Attention: a tiny MoE model with MLA (q latent and latent norms, YaRN with both
// mscales, v_head_dim ≠ qk width) trained under TP2 with sequence parallelism (heads split, down projections
// replicated on sequence shards), EP2, TP2×EP2 and DP gives the single-rank run's per-step losses and grad norms
// within 1e-5 relative; and without the q latent (a direct, column-parallel q projection) under TP2.
#include <gtest/gtest.h>

#include "config_util.h"
#include "layout_util.h"

namespace moecore {
namespace {

using testing::operator+;

std::vector<std::string> mla_flags(bool q_lora) {
  std::vector<std::string> f = {"--multi-latent-attention",
                                "--kv-lora-rank",
                                "16",
                                "--qk-head-dim",
                                "8",
                                "--qk-pos-emb-head-dim",
                                "8",
                                "--v-head-dim",
                                "12",
                                "--qk-layernorm",
                                "--rotary-scaling-factor",
                                "4",
                                "--mscale",
                                "0.8",
                                "--mscale-all-dim",
                                "0.6"};
  if (q_lora) f = f + std::vector<std::string>{"--q-lora-rank", "24"};
  return f;
}

struct MLALayout {
  std::string name;
  int64_t world;
  std::vector<std::string> flags;
  bool q_lora = true;
};

class MLALayouts : public ::testing::TestWithParam<MLALayout> {};

TEST_P(MLALayouts, MatchSingleRank) {
  const comm::ProcessGroup w = comm::ProcessGroup::world();
  const MLALayout& l = GetParam();
  if (w.size() != l.world) GTEST_SKIP() << l.name << " runs on " << l.world << " ranks";
  const std::vector<std::string> args = train::override_flags(testing::tiny_moe_flags(), {"--hidden-size", "64"}) +
                                        mla_flags(l.q_lora) + testing::mock_run_flags(32, 2, 8, 128, 4, "1e-3");
  testing::expect_same_steps(testing::small_config(args), testing::small_config(args, l.flags), w, 4);
}

const std::vector<std::string> kTP2{"--tensor-model-parallel-size", "2", "--sequence-parallel",
                                    "--expert-tensor-parallel-size", "1"};

INSTANTIATE_TEST_SUITE_P(
    Layouts, MLALayouts,
    ::testing::Values(MLALayout{"TP2_SP", 2, kTP2}, MLALayout{"TP2_SP_direct_q", 2, kTP2, false},
                      MLALayout{"EP2", 2, {"--expert-model-parallel-size", "2"}}, MLALayout{"DP2", 2, {}},
                      MLALayout{"TP2xEP2", 4, kTP2 + std::vector<std::string>{"--expert-model-parallel-size", "2"}},
                      MLALayout{"TP2xDP2_distopt", 4, kTP2 + std::vector<std::string>{"--use-distributed-optimizer"}}),
    [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace moecore
