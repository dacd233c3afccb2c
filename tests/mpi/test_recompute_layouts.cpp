// Activation recompute under parallel layouts: with each --recompute-* option, the layered MoE job (dense layer,
// MoE layers with a gated shared expert, aux and z losses, jitter, dropout) under EP2 and TP2 x SP gives bitwise
// the losses, aux losses, z-loss and grad norm of the same layout without recompute, step by step, and bitwise the
// same parameters after the steps (so every gradient was the same); no statistic or counter counted twice.
#include <gtest/gtest.h>

#include <cstdio>

#include "config_util.h"
#include "moecore/comm/process_group.h"
#include "moecore/moe/moe_layer.h"
#include "moecore/train/trainer.h"
#include "test_util.h"

namespace moecore {
namespace {

using testing::operator+;

constexpr int kSteps = 3;

struct RunResult {
  std::vector<train::StepResult> steps;
  std::vector<Tensor> params;
  std::vector<uint64_t> router_forwards;
};

RunResult train_run(const std::vector<std::string>& layout, const std::vector<std::string>& recompute,
                    const comm::ProcessGroup& w) {
  const std::vector<std::string> base =
      testing::layered_moe_flags() + testing::mock_run_flags(16, 2, 8, 120, kSteps, "1e-3") +
      std::vector<std::string>{"--make-vocab-size-divisible-by", "64", "--moe-input-jitter-eps", "0.01"};
  const train::TrainConfig c = testing::small_config(
      train::override_flags(base, {"--hidden-dropout", "0.1", "--attention-dropout", "0.1"}), layout + recompute);
  std::FILE* null = std::fopen("/dev/null", "w");
  RunResult r;
  {
    train::Trainer t(c, null, false, &w);
    for (int s = 0; s < kSteps; s++) r.steps.push_back(t.train_step());
    for (const auto& p : t.params().all()) r.params.push_back(p->value.clone());
    for (moe::MoELayer* l : t.moe_layers()) r.router_forwards.push_back(l->router().forward_count());
  }
  std::fclose(null);
  return r;
}

struct RecomputeLayoutsLayout {
  std::string name;
  int64_t world;
  std::vector<std::string> flags;
};

class RecomputeLayouts : public ::testing::TestWithParam<RecomputeLayoutsLayout> {};

TEST_P(RecomputeLayouts, BitwiseLikeNoRecompute) {
  const comm::ProcessGroup w = comm::ProcessGroup::world();
  const RecomputeLayoutsLayout& l = GetParam();
  if (w.size() != l.world) GTEST_SKIP() << l.name << " runs on " << l.world << " ranks";
  const RunResult base = train_run(l.flags, {}, w);
  const std::vector<std::vector<std::string>> options = {
      {"--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "2"},
      {"--recompute-granularity", "full", "--recompute-method", "block", "--recompute-num-layers", "2"},
      {"--recompute-activations"},  // selective, core_attn
      {"--recompute-granularity", "selective", "--recompute-modules", "moe_act", "layernorm", "shared_experts"},
      {"--recompute-granularity", "selective", "--recompute-modules", "mlp", "moe"},
      {"--moe-layer-recompute"}};
  for (const auto& o : options) {
    std::string name;
    for (const auto& s : o) name += s + " ";
    const RunResult r = train_run(l.flags, o, w);
    for (int s = 0; s < kSteps; s++) {
      const auto& a = base.steps[static_cast<size_t>(s)];
      const auto& b = r.steps[static_cast<size_t>(s)];
      EXPECT_EQ(a.lm_loss, b.lm_loss) << name << "step " << s;
      EXPECT_EQ(a.grad_norm, b.grad_norm) << name << "step " << s;
      EXPECT_EQ(a.aux_losses, b.aux_losses) << name << "step " << s;
      EXPECT_EQ(a.z_loss, b.z_loss) << name << "step " << s;
    }
    ASSERT_EQ(base.params.size(), r.params.size());
    for (size_t i = 0; i < base.params.size(); i++)
      EXPECT_TRUE(testing::bitwise_equal(base.params[i], r.params[i])) << name << "parameter " << i;
    EXPECT_EQ(base.router_forwards, r.router_forwards) << name << "router noise position";
  }
}

const std::vector<std::string> kRecomputeLayoutsTP2{"--tensor-model-parallel-size", "2", "--sequence-parallel",
                                                    "--expert-tensor-parallel-size", "1"};

INSTANTIATE_TEST_SUITE_P(
    Recompute, RecomputeLayouts,
    ::testing::Values(
        RecomputeLayoutsLayout{"EP2", 2, {"--expert-model-parallel-size", "2"}},
        RecomputeLayoutsLayout{"TP2_SP", 2, kRecomputeLayoutsTP2},
        RecomputeLayoutsLayout{"TP2_SP_ETP2", 2, {"--tensor-model-parallel-size", "2", "--sequence-parallel"}},
        RecomputeLayoutsLayout{"DP2xEP2_TP2_SP", 4,
                               kRecomputeLayoutsTP2 + std::vector<std::string>{"--expert-model-parallel-size", "2"}}),
    [](const ::testing::TestParamInfo<RecomputeLayoutsLayout>& i) { return i.param.name; });

}  // namespace
}  // namespace moecore
