// Multi-Latent Attention's flags: what they set in the model, Megatron's checks (refused before any work, naming
// the flag), the deepseek-v3 preset, and a training run that is bitwise repeatable.
#include <gtest/gtest.h>

#include <cstdio>

#include "config_util.h"
#include "moecore/train/memory_plan.h"
#include "moecore/train/model_builder.h"
#include "moecore/train/parallel_groups.h"
#include "moecore/train/trainer.h"
#include "test_util.h"

namespace moecore {
namespace {

using testing::operator+;

const std::vector<std::string> kMlaRun = testing::mock_run_flags(16, 2, 4, 64, 3, "1e-3");

std::vector<std::string> mla_model() {
  return testing::tiny_moe_flags() + std::vector<std::string>{"--multi-latent-attention",
                                                              "--kv-lora-rank",
                                                              "16",
                                                              "--qk-head-dim",
                                                              "8",
                                                              "--qk-pos-emb-head-dim",
                                                              "4",
                                                              "--v-head-dim",
                                                              "8"};
}

// Flags in `extra` replace those in `a`.
std::string mla_error(const std::vector<std::string>& a, const std::vector<std::string>& extra = {}) {
  return testing::user_error_of([&] { testing::small_config(a, extra); });
}

TEST(MLAFlags, SetTheModel) {
  train::TrainConfig c = testing::small_config(mla_model() + kMlaRun);
  nn::GPTConfig g = train::gpt_config(c, 64);
  EXPECT_TRUE(g.mla.enabled);
  EXPECT_EQ(g.mla.q_lora_rank, 0);  // Megatron's None: a direct q projection
  EXPECT_EQ(g.mla.kv_lora_rank, 16);
  EXPECT_TRUE(g.mla.yarn);  // MLA's default rope type
  EXPECT_EQ(g.mla.yarn_params.scaling_factor, 1.0);
  EXPECT_EQ(g.mla.yarn_params.original_max_position_embeddings, 4096);
  c = testing::small_config(mla_model() + kMlaRun,
                            {"--rope-type", "rope", "--q-lora-rank", "12", "--rotary-scaling-factor", "40", "--mscale",
                             "0.5", "--mscale-all-dim", "0.7"});
  g = train::gpt_config(c, 64);
  EXPECT_FALSE(g.mla.yarn);
  EXPECT_EQ(g.mla.q_lora_rank, 12);
  EXPECT_EQ(g.mla.yarn_params.scaling_factor, 40.0);
  EXPECT_EQ(g.mla.yarn_params.mscale, 0.5);
  EXPECT_EQ(g.mla.yarn_params.mscale_all_dim, 0.7);
  EXPECT_FALSE(train::gpt_config(testing::small_config(testing::tiny_moe_flags() + kMlaRun), 64).mla.enabled);
}

TEST(MLAFlags, MegatronsChecks) {
  EXPECT_NE(mla_error(testing::tiny_moe_flags() + kMlaRun + std::vector<std::string>{"--rope-type", "yarn"})
                .find("--rope-type yarn: common attention only supports --rope-type rope"),
            std::string::npos);
  EXPECT_EQ(testing::small_config(testing::tiny_moe_flags() + kMlaRun, {"--rope-type", "rope"}).rope_type, "rope");
  EXPECT_NE(mla_error(mla_model() + kMlaRun, {"--rope-type", "ntk"}).find("--rope-type ntk"), std::string::npos);
  EXPECT_NE(mla_error(mla_model() + kMlaRun, {"--group-query-attention", "--num-query-groups", "2"})
                .find("--group-query-attention is mutually exclusive with --multi-latent-attention"),
            std::string::npos);
  EXPECT_NE(mla_error(mla_model() + kMlaRun, {"--qk-pos-emb-head-dim", "5"})
                .find("--qk-pos-emb-head-dim 5 rotates 5 channels"),
            std::string::npos);
  EXPECT_NE(mla_error(mla_model() + kMlaRun, {"--rope-type", "rope", "--rotary-percent", "0.25"})
                .find("--qk-pos-emb-head-dim 4 x --rotary-percent 0.25 rotates 1 channels"),
            std::string::npos);
  EXPECT_NE(mla_error(mla_model() + kMlaRun, {"--kv-lora-rank", "0"}).find("--kv-lora-rank"), std::string::npos);
  EXPECT_NE(mla_error(mla_model() + kMlaRun, {"--cache-mla-latents"}).find("--cache-mla-latents"), std::string::npos);
  // Heads must split over TP; the latent ranks need not (the down projections are replicated).
  EXPECT_NE(mla_error(mla_model() + kMlaRun, {"--tensor-model-parallel-size", "3", "--sequence-parallel"})
                .find("divisible by --tensor-model-parallel-size 3"),
            std::string::npos);
}

TEST(MLAFlags, DeepSeekV3PresetUsesMLAWithYarn) {
  const train::TrainConfig c = testing::small_config({"--model", "deepseek-v3"}, kMlaRun);
  EXPECT_TRUE(c.multi_latent_attention);
  EXPECT_EQ(c.rope_type, "yarn");
  EXPECT_EQ(c.rotary_scaling_factor, 40.0);
  EXPECT_TRUE(c.qk_layernorm);
  nn::ParamRegistry reg;
  const train::ParallelGroups g(c, nullptr);
  const auto model = train::build_model(c, 64, reg, g);
  int mla_params = 0;
  for (const auto& p : reg.all()) {
    EXPECT_EQ(p->name.find("linear_q.weight"), std::string::npos) << p->name;  // no standard attention
    mla_params += p->name.find("self_attention.linear_kv_down_proj") != std::string::npos;
  }
  EXPECT_EQ(mla_params, c.num_layers + c.mtp_num_layers);  // and the preset's MTP depth
  // The memory plan's count before building is the model's.
  double n = 0;
  for (const auto& p : reg.all()) n += static_cast<double>(p->value.numel());
  const train::ParamCounts planned = train::count_params(c, 64, 1, 1);
  EXPECT_NEAR(planned.dense + planned.expert, n, 1e-9 * n);
}

// Same seed, same layout: bitwise identical losses; and the loss moves (the model trains).
TEST(MLAFlags, TrainingIsRepeatable) {
  const train::TrainConfig c = testing::small_config(
      mla_model() + testing::mock_run_flags(16, 2, 4, 64, 6, "1e-2"),
      {"--q-lora-rank", "12", "--qk-layernorm", "--rotary-scaling-factor", "8", "--mscale-all-dim", "1"});
  std::FILE* null = std::fopen("/dev/null", "w");
  std::vector<double> a, b;
  {
    train::Trainer t1(c, null, false, nullptr), t2(c, null, false, nullptr);
    for (int i = 0; i < 6; i++) {
      a.push_back(t1.train_step().lm_loss);
      b.push_back(t2.train_step().lm_loss);
    }
  }
  std::fclose(null);
  EXPECT_EQ(a, b);
  for (double l : a) EXPECT_TRUE(std::isfinite(l));
  EXPECT_NE(a.front(), a.back());
}

// Every selective module runs with MLA (tests/nn/test_recompute.cpp shows them bitwise), Megatron's default
// core_attn and DeepSeek-V3's recipe (mla_up_proj mlp) among them; mla_up_proj reaches the attention's config.
TEST(MLAFlags, SelectiveRecomputeModulesRunWithMLA) {
  const std::vector<std::string> a = mla_model() + kMlaRun;
  EXPECT_NO_THROW(testing::small_config(a, {"--recompute-activations"}));
  for (const char* m : {"core_attn", "layernorm", "mla_up_proj", "moe_act"})
    EXPECT_NO_THROW(testing::small_config(a, {"--recompute-activations", "--recompute-modules", m})) << m;
  const train::TrainConfig recipe =
      testing::small_config(a, {"--recompute-granularity", "selective", "--recompute-modules", "mla_up_proj", "mlp"});
  EXPECT_TRUE(recipe.no_effect.empty());
  EXPECT_TRUE(train::recompute_config(recipe).mla_up_proj);
  EXPECT_NO_THROW(testing::small_config(
      a, {"--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"}));
}

}  // namespace
}  // namespace moecore
