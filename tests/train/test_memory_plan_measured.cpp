// The memory plan (train/memory_plan.h) against the allocator's measured peak on one rank: activations dominate
// (H 64, 1024 tokens per micro-batch), and the plan must be within 10% with and without recompute, in bf16 and fp16,
// with the distributed optimizer, with several micro-batches; a step after the second allocates nothing new. The
// layouts (TP, EP, PP, DP): tests/mpi/test_memory_plan_layouts.cpp.
#include <gtest/gtest.h>

#include <algorithm>

#include "../config_util.h"
#include "memory_measure.h"

namespace moecore {
namespace {

using testing::operator+;

std::vector<std::string> model() {
  return train::override_flags(testing::tiny_moe_flags(),
                               {"--hidden-size", "64", "--moe-ffn-hidden-size", "64", "--ffn-hidden-size", "128"}) +
         testing::mock_run_flags(256, 4, 4, 256, 10, "1e-3");
}

void check(const std::vector<std::string>& extra, const std::string& what) {
  const testing::MeasuredMemory m = testing::measure_memory(testing::small_config(model(), extra));
  testing::expect_plan_matches(m, what);
}

TEST(MemoryPlanMeasured, NoRecompute) {
  check({}, "no recompute");
}
TEST(MemoryPlanMeasured, Bf16) {
  check({"--bf16"}, "bf16");
}
// --fp16: the bf16 plan's bytes (2-byte weights, stashes and rows), with attention's operands widened for the f32
// kernel.
TEST(MemoryPlanMeasured, Fp16) {
  const std::vector<std::string> fp16 = {"--fp16", "--accumulate-allreduce-grads-in-fp32", "--initial-loss-scale",
                                         "4096"};
  check(fp16, "fp16");
  check(fp16 + std::vector<std::string>{"--recompute-granularity", "selective", "--recompute-modules", "core_attn",
                                        "moe_act", "layernorm"},
        "fp16, selective core_attn moe_act layernorm");
}
TEST(MemoryPlanMeasured, SelectiveRecompute) {
  check({"--recompute-granularity", "selective", "--recompute-modules", "core_attn", "moe_act", "layernorm"},
        "selective core_attn moe_act layernorm");
}
TEST(MemoryPlanMeasured, MoeRecompute) {
  check({"--recompute-granularity", "selective", "--recompute-modules", "moe"}, "selective moe");
}
TEST(MemoryPlanMeasured, FullRecompute) {
  check({"--num-layers", "4", "--recompute-granularity", "full", "--recompute-method", "uniform",
         "--recompute-num-layers", "2"},
        "full uniform 2 of 4 layers");
}
// bf16 activation stashes (docs/differences.md) under recompute, with shared experts and their gate, and MTP.
TEST(MemoryPlanMeasured, Bf16RecomputeSharedExpertsAndMtp) {
  check({"--bf16", "--recompute-granularity", "selective", "--recompute-modules", "core_attn", "moe_act", "layernorm"},
        "bf16, selective core_attn moe_act layernorm");
  check({"--bf16", "--num-layers", "4", "--recompute-granularity", "full", "--recompute-method", "uniform",
         "--recompute-num-layers", "2"},
        "bf16, full uniform 2 of 4 layers");
  check({"--bf16", "--moe-shared-expert-intermediate-size", "64", "--moe-shared-expert-gate", "--mtp-num-layers", "1"},
        "bf16, gated shared experts, one MTP depth");
}
TEST(MemoryPlanMeasured, DistributedOptimizerBf16) {
  check({"--bf16", "--use-distributed-optimizer"}, "bf16, distributed optimizer");
}
TEST(MemoryPlanMeasured, MicroBatchesAndSharedExperts) {
  check({"--global-batch-size", "8", "--micro-batch-size", "2", "--moe-shared-expert-intermediate-size", "64",
         "--moe-layer-freq", "[0,1]"},
        "2 micro-batches, dense first layer, shared experts");
}
// Megatron's default linear biases (a dense first layer, then MoE with router and expert biases): under bf16 on the
// CPU fc1's outputs stay f32 where they have a bias.
TEST(MemoryPlanMeasured, LinearBiases) {
  std::vector<std::string> biased = model();
  biased.erase(std::find(biased.begin(), biased.end(), "--disable-bias-linear"));
  for (const bool bf16 : {false, true}) {
    std::vector<std::string> extra{"--moe-layer-freq", "[0,1]"};
    if (bf16) extra.push_back("--bf16");
    testing::expect_plan_matches(testing::measure_memory(testing::small_config(biased, extra)),
                                 bf16 ? "linear biases, bf16" : "linear biases");
  }
}
TEST(MemoryPlanMeasured, MultiTokenPrediction) {
  check({"--mtp-num-layers", "2"}, "two MTP depths");
  check({"--mtp-num-layers", "1", "--recompute-granularity", "full", "--recompute-method", "uniform",
         "--recompute-num-layers", "1"},
        "one MTP depth, full recompute");
}

TEST(MemoryPlanMeasured, MultiLatentAttention) {
  const std::vector<std::string> mla{"--multi-latent-attention",
                                     "--q-lora-rank",
                                     "32",
                                     "--kv-lora-rank",
                                     "32",
                                     "--qk-head-dim",
                                     "32",
                                     "--qk-pos-emb-head-dim",
                                     "16",
                                     "--v-head-dim",
                                     "32",
                                     "--qk-layernorm"};
  check(mla, "MLA");
  check(mla + std::vector<std::string>{"--recompute-granularity", "selective", "--recompute-modules", "mla_up_proj"},
        "MLA, mla_up_proj recompute");
  check(mla + std::vector<std::string>{"--recompute-granularity", "selective", "--recompute-modules", "core_attn",
                                       "layernorm", "mla_up_proj"},
        "MLA, core_attn layernorm mla_up_proj recompute");
  check(mla + std::vector<std::string>{"--bf16"}, "MLA, bf16");
  check(mla + std::vector<std::string>{"--bf16", "--recompute-granularity", "selective", "--recompute-modules",
                                       "mla_up_proj", "mlp"},
        "MLA, bf16, mla_up_proj mlp recompute");
}

// The stash sizes behind the plan: the modules' stash_bytes against the live bytes after a forward (the part of
// the plan that scales with tokens), within 2%.
TEST(MemoryPlanMeasured, ActivationsScaleWithTokens) {
  const testing::MeasuredMemory a = testing::measure_memory(testing::small_config(model(), {}));
  const testing::MeasuredMemory b =
      testing::measure_memory(testing::small_config(model(), {"--micro-batch-size", "2", "--global-batch-size", "2"}));
  EXPECT_NEAR(a.peak - b.peak, a.planned - b.planned, 0.05 * (a.peak - b.peak));
}

}  // namespace
}  // namespace moecore
