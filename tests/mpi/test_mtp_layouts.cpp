// Layout invariance of multi-token prediction: a tiny MoE model with D = 1 or 2 MTP depths (MoE depths: the last
// decoder layer's spec) trained under TP2 with sequence parallelism, EP2, DP2 and PP2 (MTP and its copy of the
// word embedding on the last stage), and once with MLA, gives the single-rank run's per-step LM losses, MTP losses
// and grad norms within 1e-5 relative.
#include <gtest/gtest.h>

#include "config_util.h"
#include "layout_util.h"

namespace moecore {
namespace {

using testing::operator+;

struct MTPLayout {
  std::string name;
  int64_t world;
  int64_t depths;
  std::vector<std::string> flags;
  std::vector<std::string> model = {};
};

class MTPLayouts : public ::testing::TestWithParam<MTPLayout> {};

TEST_P(MTPLayouts, MatchSingleRank) {
  const comm::ProcessGroup w = comm::ProcessGroup::world();
  const MTPLayout& l = GetParam();
  if (w.size() != l.world) GTEST_SKIP() << l.name << " runs on " << l.world << " ranks";
  const std::vector<std::string> args =
      testing::tiny_moe_flags() + testing::mock_run_flags(16, 2, 8, 120, 3, "1e-3") + l.model +
      std::vector<std::string>{"--make-vocab-size-divisible-by", "64", "--mtp-num-layers", std::to_string(l.depths),
                               "--mtp-loss-scaling-factor",      "0.3"};
  std::FILE* null = std::fopen("/dev/null", "w");
  {
    train::Trainer one(testing::small_config(args), null, false, nullptr),
        multi(testing::small_config(args, l.flags), null, false, &w);
    for (int step = 0; step < 3; step++) {
      const train::StepResult a = one.train_step(), b = multi.train_step();
      testing::expect_same_step(a, b, step);
      ASSERT_EQ(a.mtp_losses.size(), static_cast<size_t>(l.depths));
      ASSERT_EQ(b.mtp_losses.size(), a.mtp_losses.size());
      for (size_t k = 0; k < a.mtp_losses.size(); k++) {
        EXPECT_GT(a.mtp_losses[k], 0.0);
        EXPECT_NEAR(b.mtp_losses[k], a.mtp_losses[k], 1e-5 * a.mtp_losses[k]) << "step " << step << " depth " << k;
      }
    }
  }
  std::fclose(null);
}

const std::vector<std::string> kTP2{"--tensor-model-parallel-size", "2", "--sequence-parallel",
                                    "--expert-tensor-parallel-size", "1"};
const std::vector<std::string> kEP2{"--expert-model-parallel-size", "2"};
const std::vector<std::string> kPP2{"--pipeline-model-parallel-size", "2"};
const std::vector<std::string> kMLA{"--multi-latent-attention",
                                    "--kv-lora-rank",
                                    "16",
                                    "--qk-head-dim",
                                    "8",
                                    "--qk-pos-emb-head-dim",
                                    "8",
                                    "--v-head-dim",
                                    "8",
                                    "--q-lora-rank",
                                    "16"};

// DeepSeek-V3's routing with MLA (config_util.h).
const std::vector<std::string> kDeepSeek = kMLA + testing::deepseek_routing_flags();

INSTANTIATE_TEST_SUITE_P(
    Layouts, MTPLayouts,
    ::testing::Values(MTPLayout{"TP2_SP_D1", 2, 1, kTP2}, MTPLayout{"TP2_SP_D2", 2, 2, kTP2},
                      MTPLayout{"EP2_D1", 2, 1, kEP2}, MTPLayout{"EP2_D2", 2, 2, kEP2}, MTPLayout{"DP2_D2", 2, 2, {}},
                      MTPLayout{"PP2_D1", 2, 1, kPP2}, MTPLayout{"PP2_D2", 2, 2, kPP2},
                      MTPLayout{"PP2_Untied_D1", 2, 1, kPP2, {"--untie-embeddings-and-output-weights"}},
                      MTPLayout{"MLA_TP2_SP_D1", 2, 1, kTP2, kMLA}, MTPLayout{"TP2xEP2_D2", 4, 2, kTP2 + kEP2},
                      MTPLayout{"DeepSeek_TP2_SP_D1", 2, 1, kTP2, kDeepSeek},
                      MTPLayout{"DeepSeek_EP2_D1", 2, 1, kEP2, kDeepSeek},
                      MTPLayout{"DeepSeek_PP2_D1", 2, 1, kPP2, kDeepSeek},
                      MTPLayout{"DeepSeek_TP2xEP2_D1", 4, 1, kTP2 + kEP2, kDeepSeek}),
    [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace moecore
