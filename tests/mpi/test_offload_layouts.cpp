// Fine-grained activation offloading (train/activation_offload.h, CPU testing switch) under parallel layouts: with
// every offload module, the layered MoE job (dense and MoE layers, gated shared expert, GQA with qk-norm, dropout)
// under PP2 (micro-batches in flight; interleaved; with full recompute), EP2 (with selective recompute), TP2 x SP and
// ETP2 gives bitwise the losses, grad norms and parameters of the same layout without offloading, and every host block
// comes back; the plan counts the offload on every stage and names the EP dispatcher's buffers.
#include <gtest/gtest.h>

#include <cstdio>

#include "config_util.h"
#include "moecore/comm/process_group.h"
#include "moecore/train/memory_plan.h"
#include "moecore/train/model_builder.h"
#include "moecore/train/trainer.h"
#include "test_util.h"

namespace moecore {
namespace {

using testing::operator+;
using Args = std::vector<std::string>;

struct OffloadLayoutRun {
  std::vector<train::StepResult> steps;
  std::vector<Tensor> params;
  int64_t offloaded = 0, host_live = 0;
  train::MemoryPlan plan;
};

OffloadLayoutRun offload_layout_run(const Args& layout, const Args& offload, const comm::ProcessGroup& w) {
  const Args base = testing::layered_moe_flags() + testing::mock_run_flags(16, 2, 8, 120, 3, "1e-3") +
                    Args{"--make-vocab-size-divisible-by",
                         "64",
                         "--hidden-dropout",
                         "0.1",
                         "--attention-dropout",
                         "0.1",
                         "--device",
                         "cpu"};
  const train::TrainConfig c = testing::small_config(base, layout + offload);
  std::FILE* null = std::fopen("/dev/null", "w");
  OffloadLayoutRun r;
  {
    train::Trainer t(c, null, false, &w);
    for (int s = 0; s < 3; s++) r.steps.push_back(t.train_step());
    for (const auto& p : t.params().all()) r.params.push_back(p->value.clone());
    if (t.activation_offload()) {
      r.offloaded = t.activation_offload()->offloaded_bytes();
      r.host_live = t.activation_offload()->host_live_bytes();
    }
  }
  std::fclose(null);
  const int64_t pp_rank = w.rank() / (w.size() / c.pipeline_model_parallel_size);
  r.plan = train::plan_memory(c, train::build_vocabulary(c).padded, train::PlanLayout::from(c, w.size()), pp_rank);
  return r;
}

struct OffloadLayout {
  std::string name;
  int64_t world;
  Args flags;
};

class OffloadLayouts : public ::testing::TestWithParam<OffloadLayout> {};

TEST_P(OffloadLayouts, BitwiseLikeNoOffload) {
  const comm::ProcessGroup w = comm::ProcessGroup::world();
  const OffloadLayout& l = GetParam();
  if (w.size() != l.world) GTEST_SKIP() << l.name << " runs on " << l.world << " ranks";
  const Args offload = testing::offload_all_modules_flags() + Args{"--testing-offload-on-cpu"};
  const OffloadLayoutRun a = offload_layout_run(l.flags, {}, w), b = offload_layout_run(l.flags, offload, w);
  EXPECT_GT(b.offloaded, 0);
  EXPECT_EQ(b.host_live, 0);
  for (size_t s = 0; s < a.steps.size(); s++) {
    EXPECT_EQ(a.steps[s].lm_loss, b.steps[s].lm_loss) << "step " << s;
    EXPECT_EQ(a.steps[s].grad_norm, b.steps[s].grad_norm) << "step " << s;
    EXPECT_EQ(a.steps[s].aux_losses, b.steps[s].aux_losses) << "step " << s;
    EXPECT_EQ(a.steps[s].z_loss, b.steps[s].z_loss) << "step " << s;
  }
  ASSERT_EQ(a.params.size(), b.params.size());
  for (size_t i = 0; i < a.params.size(); i++)
    EXPECT_TRUE(testing::bitwise_equal(a.params[i], b.params[i])) << "parameter " << i;
  EXPECT_GT(b.plan.offloaded, 0);
  // Device: the stashes less the host bytes plus the window of layers on their way (here, with a few layers per
  // stage, the window is all of them).
  EXPECT_EQ(b.plan.peak_activations, a.plan.peak_activations - b.plan.host_offloaded + b.plan.offload_window);
  EXPECT_LE(b.plan.peak_activations, a.plan.peak_activations);
  const bool ep = std::find(l.flags.begin(), l.flags.end(), "--expert-model-parallel-size") != l.flags.end();
  EXPECT_EQ(!b.plan.buffers.empty(), ep || l.name.find("ETP") != std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(
    Offload, OffloadLayouts,
    ::testing::Values(
        OffloadLayout{
            "PP2", 2, {"--pipeline-model-parallel-size", "2", "--num-layers", "4", "--moe-layer-freq", "[0,1,1,1]"}},
        OffloadLayout{"PP2_VPP2",
                      2,
                      {"--pipeline-model-parallel-size", "2", "--num-layers", "4", "--moe-layer-freq", "[0,1,1,1]",
                       "--num-layers-per-virtual-pipeline-stage", "1"}},
        OffloadLayout{
            "PP2_full_recompute",
            2,
            {"--pipeline-model-parallel-size", "2", "--num-layers", "4", "--moe-layer-freq", "[0,1,1,1]",
             "--recompute-granularity", "full", "--recompute-method", "block", "--recompute-num-layers", "1"}},
        OffloadLayout{"EP2", 2, {"--expert-model-parallel-size", "2"}},
        OffloadLayout{"EP2_selective_recompute",
                      2,
                      {"--expert-model-parallel-size", "2", "--recompute-granularity", "selective",
                       "--recompute-modules", "core_attn", "layernorm", "moe_act", "shared_experts"}},
        OffloadLayout{
            "EP2_allgather", 2, {"--expert-model-parallel-size", "2", "--moe-token-dispatcher-type", "allgather"}},
        OffloadLayout{"TP2_SP_ETP2", 2, {"--tensor-model-parallel-size", "2", "--sequence-parallel"}}),
    [](const ::testing::TestParamInfo<OffloadLayout>& i) { return i.param.name; });

}  // namespace
}  // namespace moecore
