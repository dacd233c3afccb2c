// The --recompute-* flags with Megatron's defaults, rewrites and checks (train/config_resolve.cpp), what the model
// takes from them (train::recompute_config), and the refused neighbours (--distribute-saved-activations,
// --activation-offload-fraction).
#include <gtest/gtest.h>

#include "config_util.h"
#include "moecore/train/memory_plan.h"
#include "moecore/train/model_builder.h"
#include "test_util.h"

namespace moecore {
namespace {

using testing::operator+;
using Args = std::vector<std::string>;

train::TrainConfig recompute_config(const Args& extra) {
  return testing::small_config(testing::tiny_moe_flags() + testing::mock_run_flags(8, 1, 1, 50, 1, "1e-3"), extra);
}

std::string recompute_error(const Args& extra) {
  return testing::user_error_of([&] { recompute_config(extra); });
}

TEST(RecomputeFlags, DefaultsAndMegatronRewrites) {
  EXPECT_FALSE(train::recompute_config(recompute_config({})).any());
  // --recompute-activations is selective granularity; the modules default to core_attn.
  nn::RecomputeConfig r = train::recompute_config(recompute_config({"--recompute-activations"}));
  EXPECT_TRUE(r.core_attn && !r.full && !r.moe && !r.layernorm);
  EXPECT_EQ(recompute_config({"--recompute-activations"}).recompute_granularity, "selective");
  // --moe-layer-recompute (deprecated): selective with moe added to the default modules.
  r = train::recompute_config(recompute_config({"--moe-layer-recompute"}));
  EXPECT_TRUE(r.core_attn && r.moe && !r.moe_act);
  r = train::recompute_config(recompute_config({"--moe-layer-recompute", "--recompute-modules", "layernorm"}));
  EXPECT_TRUE(r.layernorm && r.moe && !r.core_attn);
  r = train::recompute_config(recompute_config({"--recompute-granularity", "selective", "--recompute-modules",
                                                "moe_act", "layernorm", "mlp", "moe", "shared_experts"}));
  EXPECT_TRUE(r.moe_act && r.layernorm && r.mlp && r.moe && r.shared_experts && !r.core_attn && !r.full);
  r = train::recompute_config(recompute_config(
      {"--recompute-granularity", "full", "--recompute-method", "block", "--recompute-num-layers", "1"}));
  EXPECT_TRUE(r.full && r.method == nn::RecomputeConfig::Method::Block && r.num_layers == 1 && !r.core_attn);
  // Modules and method without a granularity do nothing, as in Megatron.
  EXPECT_FALSE(train::recompute_config(recompute_config({"--recompute-modules", "moe"})).any());
}

TEST(RecomputeFlags, MegatronChecks) {
  EXPECT_NE(
      recompute_error({"--recompute-granularity", "full", "--recompute-num-layers", "1"}).find("--recompute-method"),
      std::string::npos);
  EXPECT_NE(recompute_error({"--recompute-granularity", "full", "--recompute-method", "uniform"})
                .find("--recompute-num-layers"),
            std::string::npos);
  EXPECT_NE(
      recompute_error({"--recompute-granularity", "selective", "--recompute-method", "uniform"}).find("selective"),
      std::string::npos);
  EXPECT_NE(
      recompute_error({"--recompute-activations", "--recompute-num-layers", "1"}).find("--recompute-num-layers 1"),
      std::string::npos);
  EXPECT_NE(recompute_error({"--moe-layer-recompute", "--recompute-granularity", "full", "--recompute-method",
                             "uniform", "--recompute-num-layers", "1"})
                .find("--moe-layer-recompute"),
            std::string::npos);
  EXPECT_NE(recompute_error({"--recompute-granularity", "partial"}).find("--recompute-granularity"), std::string::npos);
  EXPECT_NE(recompute_error({"--recompute-activations", "--recompute-modules", "attention"}).find("attention"),
            std::string::npos);
  // mla_up_proj: implemented with MLA; without it Megatron never reads it, listed as having no effect.
  const train::TrainConfig no_mla = recompute_config({"--recompute-activations", "--recompute-modules", "mla_up_proj"});
  ASSERT_EQ(no_mla.no_effect.size(), 1u);
  EXPECT_NE(no_mla.no_effect[0].find("this model has none"), std::string::npos);
  EXPECT_NE(recompute_error({"--recompute-activations", "--recompute-modules", "mhc"}).find("mhc"), std::string::npos);
  // MTP: Megatron's MTP recompute asserts recompute_num_layers == 1 under uniform; block leaves MTP alone.
  const Args full_uniform_2{"--recompute-granularity", "full", "--recompute-method", "uniform",
                            "--recompute-num-layers",  "2",    "--mtp-num-layers",   "1"};
  EXPECT_NE(recompute_error(full_uniform_2).find("MTP recompute needs --recompute-num-layers 1"), std::string::npos);
  EXPECT_TRUE(train::gpt_config(recompute_config({"--recompute-granularity", "full", "--recompute-method", "uniform",
                                                  "--recompute-num-layers", "1", "--mtp-num-layers", "1"}),
                                64)
                  .mtp.recompute);
  EXPECT_FALSE(train::gpt_config(recompute_config({"--recompute-granularity", "full", "--recompute-method", "block",
                                                   "--recompute-num-layers", "2", "--mtp-num-layers", "1"}),
                                 64)
                   .mtp.recompute);
}

TEST(RecomputeFlags, RefusedNeighbours) {
  EXPECT_NE(recompute_error({"--distribute-saved-activations"}).find("--distribute-saved-activations"),
            std::string::npos);
  // Fine-grained activation offloading is implemented (tests/train/test_activation_offload.cpp); its Megatron
  // neighbours that adapt it at warm-up are not.
  EXPECT_NE(recompute_error({"--activation-offload-fraction", "0.5"}).find("not supported"), std::string::npos);
}

// The plan printed at start counts full recompute: chunk inputs kept, one replayed chunk in backward.
TEST(RecomputeFlags, MemoryPlanCountsFullRecompute) {
  auto planned = [](const train::TrainConfig& c) {
    const train::MemoryPlan m = train::plan_memory(c, 64, train::PlanLayout{}, 0);
    return m.peak_activations;
  };
  const double none = planned(recompute_config({}));
  const double uniform = planned(recompute_config(
      {"--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"}));
  const double block = planned(recompute_config(
      {"--recompute-granularity", "full", "--recompute-method", "block", "--recompute-num-layers", "1"}));
  EXPECT_LT(uniform, none);
  EXPECT_LT(block, none);
  EXPECT_LT(uniform, block);  // 2 layers: uniform keeps 2 layer inputs; block 1 input and layer 1 whole
}

}  // namespace
}  // namespace moecore
