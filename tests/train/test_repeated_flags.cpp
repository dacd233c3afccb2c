// A flag given twice keeps its last value, as argparse does for a Megatron launch script's base line and its
// overrides: scalars, switches, list flags (the last occurrence's values replace the earlier ones) and Megatron's
// rule flags; and the command line over the --config YAML.
#include <gtest/gtest.h>

#include <fstream>

#include "config_util.h"
#include "moecore/train/config/megatron_flags.h"
#include "test_util.h"

namespace moecore {
namespace {

using testing::operator+;
using Values = std::pair<std::string, std::vector<std::string>>;

std::vector<std::string> tiny_run() {
  return testing::tiny_moe_flags() + testing::mock_run_flags(16, 2, 2, 64, 1, "1e-3");
}

const std::vector<std::string>* cli_value(const train::ParsedFlags& p, const std::string& flag) {
  for (const auto& [name, vals] : p.cli.values)
    if (name == flag) return &vals;
  return nullptr;
}

TEST(RepeatedFlags, AScalarKeepsItsLastValue) {
  const train::ParsedFlags p = train::parse_flags({"--lr", "1e-4", "--seed", "3", "--lr", "3e-4"});
  ASSERT_EQ(p.cli.values.size(), 2u);
  EXPECT_EQ(*cli_value(p, "lr"), std::vector<std::string>{"3e-4"});
  const train::TrainConfig c = train::parse_train_config(tiny_run() + std::vector<std::string>{"--lr", "3e-4"});
  EXPECT_EQ(c.lr, 3e-4);  // tiny_run gave --lr 1e-3 first
  // The --flag=value spelling and the underscore alias of a flag are the same option.
  const train::ParsedFlags q =
      train::parse_flags({"--micro-batch-size=8", "--micro-batch-size", "2", "--use-checkpoint-opt_param-scheduler",
                          "--use-checkpoint-opt-param-scheduler"});
  EXPECT_EQ(*cli_value(q, "micro-batch-size"), std::vector<std::string>{"2"});
  EXPECT_EQ(*cli_value(q, "use-checkpoint-opt_param-scheduler"), std::vector<std::string>{"true"});
}

TEST(RepeatedFlags, ASwitchGivenTwiceIsSet) {
  const train::ParsedFlags p = train::parse_flags({"--swiglu", "--bf16", "--swiglu"});
  EXPECT_EQ(*cli_value(p, "swiglu"), std::vector<std::string>{"true"});
  const train::TrainConfig c = train::parse_train_config(tiny_run() + std::vector<std::string>{"--swiglu"});
  EXPECT_TRUE(c.swiglu);
}

TEST(RepeatedFlags, AListFlagsLastOccurrenceReplacesTheEarlierOnes) {
  const train::ParsedFlags p = train::parse_flags({"--data-path", "a", "b", "--seed", "3", "--data-path", "c",
                                                   "--moe-layer-freq", "[1,1]", "--moe-layer-freq", "[0, 1]"});
  EXPECT_EQ(*cli_value(p, "data-path"), std::vector<std::string>{"c"});
  ASSERT_EQ(cli_value(p, "moe-layer-freq")->size(), 1u);  // a list expression stays one value, the last
  EXPECT_EQ(cli_value(p, "moe-layer-freq")->front(), " [0, 1]");
  // Concatenated, the two types and three coefficients would be refused (one coefficient per type).
  const train::TrainConfig c = train::parse_train_config(
      tiny_run() + std::vector<std::string>{"--moe-router-load-balancing-type", "aux_loss", "seq_aux_loss",
                                            "--moe-aux-loss-coeff", "1e-2", "1e-3", "--moe-router-load-balancing-type",
                                            "seq_aux_loss", "--moe-aux-loss-coeff", "1e-3"});
  EXPECT_EQ(c.moe_router_load_balancing_type, std::vector<std::string>{"seq_aux_loss"});
  EXPECT_EQ(c.moe_aux_loss_coeff, std::vector<std::string>{"1e-3"});
}

TEST(RepeatedFlags, AMegatronRuleFlagKeepsItsLastValue) {
  // Refused with its first value, no effect with its last: accepted, and listed once with the last value.
  const train::TrainConfig c = train::parse_train_config(
      tiny_run() + std::vector<std::string>{"--transformer-impl", "inference_optimized", "--use-mcore-models",
                                            "--transformer-impl", "local", "--use-mcore-models"});
  ASSERT_EQ(c.no_effect.size(), 2u);
  EXPECT_EQ(c.no_effect[0].rfind("--transformer-impl local: ", 0), 0u) << c.no_effect[0];
  EXPECT_EQ(c.no_effect[1].rfind("--use-mcore-models: ", 0), 0u) << c.no_effect[1];
  const std::string e = testing::user_error_of([&] {
    train::parse_flags({"--transformer-impl", "local", "--transformer-impl", "inference_optimized"});
  });
  EXPECT_EQ(e.rfind("--transformer-impl inference_optimized: ", 0), 0u) << e;
  // A list-arity rule flag: its last occurrence's values.
  train::GivenFlags given;
  train::give_megatron_flag(given, "rampup-batch-size", {"4", "4", "100"});
  train::give_megatron_flag(given, "use-mcore-models", {});
  train::give_megatron_flag(given, "rampup-batch-size", {"8", "8", "200"});
  EXPECT_EQ(given, (train::GivenFlags{{"rampup-batch-size", {"8", "8", "200"}}, {"use-mcore-models", {}}}));
}

TEST(RepeatedFlags, TheCommandLineOverridesTheConfigFile) {
  const std::string y = testing::fresh_temp_path("repeated_flags_yaml") + ".yaml";
  std::ofstream(y) << "lr: 0.5\nseed: 7\nswiglu: false\ntransformer_impl: transformer_engine\n"
                      "moe-router-load-balancing-type: [aux_loss, seq_aux_loss]\n";
  const train::TrainConfig c =
      train::parse_train_config(std::vector<std::string>{"--config", y} + tiny_run() +
                                std::vector<std::string>{"--lr", "3e-4", "--transformer-impl", "local",
                                                         "--moe-router-load-balancing-type", "aux_loss"});
  EXPECT_EQ(c.lr, 3e-4);
  EXPECT_EQ(c.seed, 7);   // only the file gives it
  EXPECT_TRUE(c.swiglu);  // tiny_run's --swiglu over the file's false
  EXPECT_EQ(c.moe_router_load_balancing_type, std::vector<std::string>{"aux_loss"});
  ASSERT_EQ(c.no_effect.size(), 1u);
  EXPECT_EQ(c.no_effect[0].rfind("--transformer-impl local: ", 0), 0u) << c.no_effect[0];
  // A rule flag the command line gives with a refused value is refused, whatever the file says.
  std::ofstream(y) << "transformer-impl: local\n";
  const std::string e = testing::user_error_of([&] {
    train::parse_flags({"--config", y, "--transformer-impl", "inference_optimized"});
  });
  EXPECT_EQ(e.rfind("--transformer-impl inference_optimized: ", 0), 0u) << e;
}

}  // namespace
}  // namespace moecore
