// The flag table and the configuration passes: defaults from the table rows, the role lists resume and upcycling
// compare, one resolve pass whose derived values follow their inputs (and a Trainer that refuses a config changed
// since), --moe-layer-freq parsed once into per-layer flags, a parser that reads no file but the YAML, and --help
// grouped with defaults.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "config_util.h"
#include "moecore/train/model_builder.h"
#include "moecore/train/observe/cost_model.h"
#include "moecore/train/trainer.h"
#include "test_util.h"

namespace moecore {
namespace {

using testing::operator+;
using train::TrainConfig;

bool has(const std::vector<std::string>& v, const std::string& x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

TEST(TrainConfig, TableRolesGiveTheResumeAndUpcyclingLists) {
  std::set<std::string> names;
  for (const auto& f : train::flag_table()) EXPECT_TRUE(names.insert(f.name).second) << f.name << " twice";
  EXPECT_EQ(train::config_json(TrainConfig{}).size(), names.size());
  // Megatron checks its scheduler state on resume: these flags.
  EXPECT_EQ(train::flag_names(train::kSchedule),
            (std::vector<std::string>{"lr", "min-lr", "lr-decay-style", "lr-wsd-decay-style", "lr-warmup-iters",
                                      "lr-decay-iters", "lr-wsd-decay-iters"}));
  // Upcycling keeps everything outside the MoE layers: the dense model's identity flags must match.
  EXPECT_EQ(train::flag_names(train::kIdentity, train::FlagGroup::Model),
            (std::vector<std::string>{"num-layers",
                                      "hidden-size",
                                      "ffn-hidden-size",
                                      "num-attention-heads",
                                      "num-query-groups",
                                      "kv-channels",
                                      "qk-layernorm",
                                      "rotary-base",
                                      "rotary-percent",
                                      "position-embedding-type",
                                      "no-position-embedding",
                                      "normalization",
                                      "apply-layernorm-1p",
                                      "norm-epsilon",
                                      "untie-embeddings-and-output-weights",
                                      "swiglu",
                                      "squared-relu",
                                      "disable-bias-linear",
                                      "mtp-num-layers",
                                      "multi-latent-attention",
                                      "q-lora-rank",
                                      "kv-lora-rank",
                                      "qk-head-dim",
                                      "qk-pos-emb-head-dim",
                                      "v-head-dim",
                                      "rope-type",
                                      "rotary-scaling-factor",
                                      "mscale",
                                      "mscale-all-dim",
                                      "yarn-beta-fast",
                                      "yarn-beta-slow",
                                      "yarn-original-max-position-embeddings"}));
  const auto identity = train::flag_names(train::kIdentity), ckpt_args = train::flag_names(train::kCheckpointArg);
  EXPECT_TRUE(has(identity, "moe-router-topk") && has(identity, "moe-layer-freq") && !has(identity, "lr"));
  for (const auto& n : identity) EXPECT_TRUE(has(ckpt_args, n)) << n;
  EXPECT_EQ(ckpt_args.size(), identity.size() + 3);
  EXPECT_TRUE(has(ckpt_args, "group-query-attention") && has(ckpt_args, "max-position-embeddings") &&
              has(ckpt_args, "padded-vocab-size"));
}

// A flag's default lives in its table row: a fresh TrainConfig holds every row's default, two rows that set one field
// (Megatron's two spellings) agree on it, and each default has its field's type.
TEST(TrainConfig, DefaultsComeFromTheTableRows) {
  const TrainConfig c;
  for (const auto& f : train::flag_table()) {
    std::visit(
        [&](auto m) {
          using T = std::decay_t<decltype(c.*m)>;
          ASSERT_TRUE(std::holds_alternative<T>(f.default_value)) << f.name;
          EXPECT_EQ(c.*m, std::get<T>(f.default_value)) << f.name;
        },
        f.field);
  }
  EXPECT_EQ(c.num_layers, 2);
  EXPECT_EQ(c.hidden_dropout, 0.1);
  EXPECT_EQ(c.moe_router_load_balancing_type, std::vector<std::string>{"aux_loss"});
  EXPECT_EQ(c.normalization, "LayerNorm");
  EXPECT_EQ(c.ckpt_step, -1);
}

TEST(TrainConfig, ResolveFollowsInputsAndTheTrainerRefusesAChangedConfig) {
  TrainConfig c = testing::small_config(testing::tiny_moe_flags() + testing::mock_run_flags(16, 2, 2, 64, 2, "1e-3"));
  EXPECT_TRUE(train::is_resolved(c));
  EXPECT_EQ(c.kv_channels, 8);       // H 32 / 4 heads
  EXPECT_EQ(c.ffn_hidden_size, 64);  // SwiGLU: 8H/3 = 85, rounded down to 64
  EXPECT_NE(train::describe(c).find("kv-channels ...."), std::string::npos);
  EXPECT_NE(train::describe(c).find(" 8 (derived)"), std::string::npos);
  c.hidden_size = 64;
  EXPECT_FALSE(train::is_resolved(c));
  std::FILE* null = std::fopen("/dev/null", "w");
  EXPECT_THROW(train::Trainer(c, null, false), InternalError) << "stale kv-channels and ffn-hidden-size";
  std::fclose(null);
  train::resolve(c);
  EXPECT_TRUE(train::is_resolved(c));
  EXPECT_EQ(c.kv_channels, 16);          // derived again from the new H
  EXPECT_EQ(c.ffn_hidden_size, 128);     // 170 rounded down to 128
  EXPECT_EQ(c.moe_ffn_hidden_size, 32);  // given, not derived
  c.kv_channels = 8;                     // set since: kept
  train::resolve(c);
  EXPECT_EQ(c.kv_channels, 8);
  EXPECT_EQ(c.global_batch_size, 2);
}

// --padded-vocab-size: the embedding's rows exactly as given (Megatron then skips its padding), at least the
// vocabulary, divisible by TP, and equal to a loaded checkpoint's rows; unset, the vocabulary is padded as before.
TEST(TrainConfig, PaddedVocabSizeIsTheRowsAsGiven) {
  const auto run = testing::tiny_moe_flags() + testing::mock_run_flags(16, 2, 2, 100, 1, "1e-3");
  EXPECT_EQ(train::build_vocabulary(testing::small_config(run)).padded, 128);  // 100 padded to a multiple of 128
  const TrainConfig c = testing::small_config(run, {"--padded-vocab-size", "150"});
  EXPECT_EQ(train::build_vocabulary(c).padded, 150);
  EXPECT_TRUE(has(train::flag_names(train::kCheckpointArg), "padded-vocab-size"));
  std::FILE* null = std::fopen("/dev/null", "w");
  train::Trainer t(c, null, false);
  std::fclose(null);
  EXPECT_EQ(t.params().get("embedding.word_embeddings.weight").value.dim(0), 150);
  std::string e = testing::user_error_of([&] { testing::small_config(run, {"--padded-vocab-size", "99"}); });
  EXPECT_NE(e.find("--padded-vocab-size 99 is smaller than the vocabulary (100 token ids)"), std::string::npos) << e;
  e = testing::user_error_of([&] {
    testing::small_config(run, {"--padded-vocab-size", "151", "--tensor-model-parallel-size", "2"});
  });
  EXPECT_NE(e.find("--padded-vocab-size 151 is not divisible by --tensor-model-parallel-size 2"), std::string::npos)
      << e;
  e = testing::user_error_of([&] { train::build_vocabulary(c, 256); });
  EXPECT_NE(e.find("--padded-vocab-size 150 differs from the 256 vocabulary rows of the checkpoint"), std::string::npos)
      << e;
  EXPECT_EQ(train::build_vocabulary(c, 150).padded, 150);
}

// --moe-layer-freq is parsed once, by resolve, into one entry per layer; its users read that, and the string stays
// what checkpoints save.
TEST(TrainConfig, MoeLayerFreqIsResolvedOnceIntoLayers) {
  const auto run = testing::tiny_moe_flags() + testing::mock_run_flags(16, 2, 2, 64, 2, "1e-3");
  for (const auto& [freq, layers] :
       std::vector<std::pair<std::string, std::vector<bool>>>{{"1", {true, true, true, true}},
                                                              {"2", {true, false, true, false}},
                                                              {"[0,1,1,0]", {false, true, true, false}},
                                                              {"([0]*1+[1]*2+[0])", {false, true, true, false}}}) {
    TrainConfig c = testing::small_config(run, {"--num-layers", "4", "--moe-layer-freq", freq});
    EXPECT_EQ(c.is_moe_layer, layers) << freq;
    EXPECT_NE(train::config_json(c)["moe-layer-freq"].get<std::string>().find(freq), std::string::npos);  // saved
    // The FLOP count reads the resolved layers, never the string again.
    const double flops = train::num_floating_point_operations(c, 128);
    c.moe_layer_freq = "not a pattern";
    EXPECT_EQ(train::num_floating_point_operations(c, 128), flops) << freq;
  }
  EXPECT_EQ(testing::small_config(run, {"--num-experts", "0", "--moe-ffn-hidden-size", "0"}).is_moe_layer,
            (std::vector<bool>{false, false}));
  // A bad form: refused when the configuration is resolved, naming the flag and its value.
  for (const std::string bad : {"[1,2]", "0", "[1,1,1]", "(1"}) {
    const std::string e = testing::user_error_of([&] { testing::small_config(run, {"--moe-layer-freq", bad}); });
    EXPECT_EQ(e.rfind("--moe-layer-freq '", 0), 0u) << e;
    EXPECT_NE(e.find(bad + "' is not valid"), std::string::npos) << e;
  }
}

TEST(TrainConfig, ParserReadsNoFileButTheYaml) {
  const train::ParsedFlags p = train::parse_flags(
      {"--num-layers", "3", "--load-hf", "/nonexistent/hf", "--swiglu", "--moe-layer-freq", "[0,1]"});
  EXPECT_TRUE(p.yaml.values.empty());
  ASSERT_EQ(p.cli.values.size(), 4u);
  EXPECT_EQ(p.cli.values[0], (std::pair<std::string, std::vector<std::string>>{"num-layers", {"3"}}));
  EXPECT_EQ(p.cli.values[1], (std::pair<std::string, std::vector<std::string>>{"swiglu", {"true"}}));
  EXPECT_EQ(p.cli.values[2].second.size(), 1u) << "a list expression stays one value";
  EXPECT_EQ(p.cli.values[3], (std::pair<std::string, std::vector<std::string>>{"load-hf", {"/nonexistent/hf"}}));
  const std::string e = testing::error_of([&] { train::compose_train_config(p); });
  EXPECT_NE(e.find("--load-hf /nonexistent/hf: no config.json"), std::string::npos) << e;
  std::string help;
  try {
    train::parse_flags({"--help"});
  } catch (const train::HelpRequested& h) {
    help = h.text;
  }
  size_t at = 0;
  for (const char* s :
       {"Model:", "--num-layers INT=2", "--ffn-hidden-size INT ", "Mixture of experts:", "--moe-router-topk INT=2",
        "Optimizer and schedule:", "--lr FLOAT=0.0001",
        "Parallelism:", "Data:", "Evaluation, logging and generation:", "Checkpoints:", "--load-hf TEXT"}) {
    const size_t next = help.find(s, at);
    EXPECT_NE(next, std::string::npos) << s << " in order in\n" << help;
    if (next != std::string::npos) at = next;
  }
}

}  // namespace
}  // namespace moecore
