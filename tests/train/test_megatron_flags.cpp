// Every Megatron-LM flag has exactly one rule: in moecore's flag table (implemented) or in the rules of
// megatron_flags.h (no effect, no effect for some values, refused). Each flag of tests/train/megatron_flags.txt
// parses with a value of its arity and gets its rule, never "unknown flag"; no-effect flags are listed for the start
// of the run; refused ones stop the flag pass naming the flag. Also YAML keys, --help, and Megatron's --ckpt-format
// values (moecore's own format, listed as without effect).
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <set>

#include "config_util.h"
#include "moecore/core/error.h"
#include "moecore/train/config/megatron_flags.h"
#include "test_util.h"

namespace moecore {
namespace {

using testing::operator+;
using train::RuleKind;

std::vector<std::string> megatron_tiny_run() {
  return testing::tiny_moe_flags() + testing::mock_run_flags(16, 2, 2, 64, 1, "1e-3");
}

bool has_line_for(const std::vector<std::string>& lines, const std::string& flag) {
  return std::any_of(lines.begin(), lines.end(), [&](const std::string& l) { return l.rfind(flag, 0) == 0; });
}

TEST(MegatronFlags, TheListHoldsBothCommitsFlags) {
  std::ifstream in(std::string(MOECORE_SOURCE_DIR) + "/tests/train/megatron_flags.txt");
  std::string line, header;
  size_t n = 0;
  while (std::getline(in, line)) {
    if (line.rfind('#', 0) == 0)
      header += line + "\n";
    else
      n++;
  }
  EXPECT_NE(header.find("# core_v0.15.3 = "), std::string::npos);
  EXPECT_NE(header.find("# HEAD = "), std::string::npos);
  EXPECT_EQ(n, train::megatron_flags().size());  // the build compiled the committed file in
  EXPECT_GT(n, 800u);
  for (const char* f : {"fp16", "moe-router-topk", "transformer-impl", "no-gradient-accumulation-fusion",
                        "use-mcore-models", "recompute-granularity", "ckpt-format"})
    EXPECT_NE(train::find_megatron_flag(f), nullptr) << f;
}

TEST(MegatronFlags, EveryFlagIsInExactlyOneOfTheTableAndTheRules) {
  for (const auto& f : train::megatron_flags()) {
    const bool in_table = train::find_flag(f.name) != nullptr;
    const bool ruled = train::megatron_rule(f.name) != nullptr;
    EXPECT_TRUE(in_table != ruled) << "--" << f.name << (in_table ? " is in the table and has a rule" : " has no rule");
  }
  std::map<std::string, int> named;
  for (const auto& r : train::megatron_flag_rules()) {
    EXPECT_FALSE(r.why.empty());
    EXPECT_EQ(r.kind == RuleKind::NoEffectFor, !r.values.empty() && !r.otherwise.empty()) << r.why;
    for (const auto& n : r.names) {
      named[n]++;
      EXPECT_NE(train::find_megatron_flag(n), nullptr) << "--" << n << " is not a Megatron flag";
      EXPECT_EQ(train::find_flag(n), nullptr) << "--" << n << " is in the flag table";
    }
    for (const auto& p : r.prefixes) {
      const bool used = std::any_of(train::megatron_flags().begin(), train::megatron_flags().end(),
                                    [&](const auto& f) { return f.name.rfind(p, 0) == 0; });
      EXPECT_TRUE(used) << "prefix " << p << " matches no Megatron flag";
    }
  }
  for (const auto& [n, count] : named) EXPECT_EQ(count, 1) << "--" << n << " is named by " << count << " rules";
  for (const auto& f : train::flag_table())  // no prefix rule catches an implemented flag
    EXPECT_EQ(train::megatron_rule(f.name), nullptr) << "--" << f.name;
}

// The walk: each ruled flag with a valid value for its arity, over a tiny valid run.
TEST(MegatronFlags, EveryRuledFlagParsesToItsRule) {
  size_t no_effect = 0, refused = 0;
  for (const train::MegatronFlag* f : train::megatron_ruled_flags()) {
    const train::FlagRule* r = train::megatron_rule(f->name);
    std::vector<std::string> args = megatron_tiny_run() + std::vector<std::string>{"--" + f->name};
    std::string value;
    if (f->arity != train::MegatronArity::Switch) {
      value = r->kind == RuleKind::NoEffectFor ? r->values[0] : (f->choices.empty() ? "1" : f->choices[0]);
      args.push_back(value);
    }
    if (r->kind == RuleKind::Refused) {
      refused++;
      const std::string e = testing::user_error_of([&] { train::parse_flags(args); });
      EXPECT_EQ(e.rfind("--" + f->name, 0), 0u) << e;
      EXPECT_NE(e.find(r->why), std::string::npos) << e;
      continue;
    }
    no_effect++;
    train::TrainConfig c;
    EXPECT_EQ(testing::error_of([&] { c = train::parse_train_config(args); }), "") << "--" << f->name;
    ASSERT_EQ(c.no_effect.size(), 1u) << "--" << f->name;
    EXPECT_EQ(c.no_effect[0], "--" + f->name + (value.empty() ? "" : " " + value) + ": " + r->why);
    if (r->kind == RuleKind::NoEffectFor) {  // another value: refused, naming the flag, the value and the rule
      const std::string e = testing::user_error_of([&] {
        train::parse_flags(megatron_tiny_run() + std::vector<std::string>{"--" + f->name, "bogus"});
      });
      EXPECT_EQ(e.rfind("--" + f->name + " bogus: " + r->otherwise, 0), 0u) << e;
    }
  }
  EXPECT_GT(no_effect, 150u);
  EXPECT_GT(refused, 300u);
}

TEST(MegatronFlags, NoEffectFlagsAreListedOnceInTheGivenOrder) {
  const auto c = train::parse_train_config(
      megatron_tiny_run() + std::vector<std::string>{"--use-mcore-models", "--attention-backend", "flash",
                                                     "--no-gradient-accumulation-fusion", "--main-params-dtype", "fp32",
                                                     "--moe-permute-fusion"});
  ASSERT_EQ(c.no_effect.size(), 5u);
  EXPECT_EQ(c.no_effect[0].rfind("--use-mcore-models: ", 0), 0u);
  EXPECT_EQ(c.no_effect[1].rfind("--attention-backend flash: ", 0), 0u);
  EXPECT_EQ(c.no_effect[3].rfind("--main-params-dtype fp32: ", 0), 0u);
  const std::string listing = train::describe_no_effect(c.no_effect);
  EXPECT_EQ(listing.rfind("no effect in moecore:\n  --use-mcore-models: ", 0), 0u) << listing;
  EXPECT_EQ(train::describe_no_effect({}), "");
  EXPECT_TRUE(train::parse_train_config(megatron_tiny_run()).no_effect.empty());
  // A one-value flag takes a bracketed value whole, and is followed by another flag as usual.
  const auto d =
      train::parse_train_config(megatron_tiny_run() + std::vector<std::string>{"--main-params-dtype=fp32",
                                                                               "--num-workers", "[2]", "--seed", "7"});
  EXPECT_TRUE(has_line_for(d.no_effect, "--main-params-dtype fp32: "));
  EXPECT_TRUE(has_line_for(d.no_effect, "--num-workers [2]: "));
  EXPECT_EQ(d.seed, 7);
}

TEST(MegatronFlags, RefusedInTheFlagPassWithTheFeatureNamed) {
  auto refusal = [](std::vector<std::string> extra) {
    return testing::user_error_of([&] { train::parse_flags(extra); });  // no valid run needed: refused first
  };
  EXPECT_EQ(
      refusal({"--batch-invariant-mode"}).rfind("--batch-invariant-mode: batch-invariant kernels is not supported", 0),
      0u);
  EXPECT_NE(refusal({"--distribute-saved-activations"}).find("full recompute"), std::string::npos);
  EXPECT_NE(refusal({"--transformer-impl", "inference_optimized"})
                .find("--transformer-impl inference_optimized: the inference-optimized implementation"),
            std::string::npos);
  EXPECT_NE(refusal({"--main-params-dtype", "fp16"}).find("(no effect in moecore only with fp32)"), std::string::npos);
  EXPECT_NE(refusal({"--wandb-project", "p"}).find("Weights & Biases"), std::string::npos);
  EXPECT_NE(refusal({"--no-save-optim"}).find("--no-load-optim"), std::string::npos);
  // A BooleanOptionalAction flag of Megatron is a switch (and --no-...), as argparse takes it.
  EXPECT_NE(refusal({"--rl-use-sequence-packing"}).find("not a GPT pretraining feature"), std::string::npos);
  EXPECT_NE(refusal({"--no-rl-use-sequence-packing"}).find("not a GPT pretraining feature"), std::string::npos);
  EXPECT_NE(refusal({"--rampup-batch-size", "4", "4", "100"}).find("batch-size rampup"), std::string::npos);
  // CUDA graphs: accepted without effect, Megatron's rules on them kept (tests/train/test_cuda_graph_flags.cpp).
  EXPECT_NE(refusal({"--cuda-graph-impl", "eager"}).find("--cuda-graph-impl eager: not a CUDA graph implementation"),
            std::string::npos);
}

// Megatron's inference scripts add their own flags to its parser (megatron/inference/utils.py); a launch line of
// theirs is refused naming the first such flag as given, and a flag nobody has is named as unknown, in order.
TEST(MegatronFlags, InferenceScriptFlagsAndUnknownFlagsAreRefusedByName) {
  auto refusal = [](std::vector<std::string> extra) {
    return testing::user_error_of([&] { train::parse_flags(extra); });
  };
  const std::string inference = refusal({"--num-layers", "2", "--temperature", "1.0", "--prompts", "a b", "c"});
  EXPECT_EQ(inference.rfind("moecore train: --temperature is a flag of Megatron's inference scripts", 0), 0u)
      << inference;
  EXPECT_NE(inference.find("moecore generate --load DIR --prompt TEXT"), std::string::npos);
  EXPECT_EQ(refusal({"--top_k", "1"}).rfind("moecore train: --top_k is a flag of Megatron's inference", 0), 0u);
  EXPECT_EQ(refusal({"--enable-gpt-oss"}).rfind("moecore train: --enable-gpt-oss is a flag of NVIDIA ModelOpt", 0), 0u);
  const std::string unknown = refusal({"--hidden-size", "8", "--not-a-flag=3", "--nor-this"});
  EXPECT_EQ(unknown.rfind("moecore train: unknown flag --not-a-flag: neither moecore's nor", 0), 0u) << unknown;
  for (const char* f : {"rl-use-sequence-packing", "no-rl-use-sequence-packing", "inference-wandb-logging"}) {
    ASSERT_NE(train::find_megatron_flag(f), nullptr) << f;
    EXPECT_EQ(train::find_megatron_flag(f)->arity, train::MegatronArity::Switch) << f;
  }
}

// Megatron divides RoPE's positions by --rotary-seq-len-interpolation-factor: 1 (Qwen3's example lines) changes
// nothing; another factor is refused by name.
TEST(MegatronFlags, RotaryInterpolationFactorOneHasNoEffect) {
  const auto c = train::parse_train_config(megatron_tiny_run() +
                                           std::vector<std::string>{"--rotary-seq-len-interpolation-factor", "1"});
  EXPECT_TRUE(has_line_for(c.no_effect, "--rotary-seq-len-interpolation-factor 1: RoPE positions divided by 1"));
  const std::string e = testing::user_error_of([] {
    train::parse_flags({"--rotary-seq-len-interpolation-factor", "4"});
  });
  EXPECT_NE(e.find("--rotary-seq-len-interpolation-factor 4: RoPE position interpolation"), std::string::npos) << e;
}

TEST(MegatronFlags, MegatronsCkptFormatsSelectMoecoresOwnAndAreListedWithTheWayOver) {
  const train::TrainConfig own = train::parse_train_config(megatron_tiny_run());
  EXPECT_EQ(own.ckpt_format, "moecore");
  EXPECT_TRUE(own.no_effect.empty());
  EXPECT_TRUE(train::parse_train_config(megatron_tiny_run() + std::vector<std::string>{"--ckpt-format", "moecore"})
                  .no_effect.empty());
  for (const std::string fmt : {"torch_dist", "torch", "zarr", "torch_dcp", "fsdp_dtensor"}) {
    // fsdp_dtensor only with Megatron FSDP (Megatron's rule; tests/train/test_fsdp_flags.cpp).
    std::vector<std::string> extra{"--ckpt-format", fmt, "--use-mcore-models"};
    if (fmt == "fsdp_dtensor") extra.push_back("--use-megatron-fsdp");
    const train::TrainConfig c = train::parse_train_config(megatron_tiny_run() + extra);
    EXPECT_EQ(c.ckpt_format, fmt);
    ASSERT_EQ(c.no_effect.size(), 2u) << fmt;
    const std::string& line = c.no_effect[1];
    EXPECT_EQ(line.rfind("--ckpt-format " + fmt + ": moecore saves and loads its own checkpoint format", 0), 0u)
        << line;
    EXPECT_NE(line.find("moecore convert hf-to-native --input HF_DIR --output DIR"), std::string::npos) << line;
    train::TrainConfig again = c;
    train::resolve(again);  // listed once however often resolve runs
    EXPECT_EQ(again.no_effect, c.no_effect);
  }
  const std::string e = testing::user_error_of([&] {
    train::parse_train_config(megatron_tiny_run() + std::vector<std::string>{"--ckpt-format", "safetensors"});
  });
  EXPECT_EQ(e.rfind("--ckpt-format safetensors is not accepted; one of: moecore, torch, torch_dist", 0), 0u) << e;
  // Megatron's deprecated selectors and its format detection: no effect; converting on load: refused.
  const train::TrainConfig d = train::parse_train_config(
      megatron_tiny_run() +
      std::vector<std::string>{"--use-dist-ckpt", "--dist-ckpt-format", "torch_dist", "--auto-detect-ckpt-format"});
  ASSERT_EQ(d.no_effect.size(), 3u);
  EXPECT_EQ(d.no_effect[0].rfind("--use-dist-ckpt: deprecated in Megatron, which ignores it", 0), 0u);
  EXPECT_EQ(d.no_effect[1].rfind("--dist-ckpt-format torch_dist: deprecated in Megatron", 0), 0u);
  EXPECT_EQ(d.no_effect[2].rfind("--auto-detect-ckpt-format: moecore saves and loads its own", 0), 0u);
  for (const std::vector<std::string>& f :
       {std::vector<std::string>{"--ckpt-convert-format", "torch"}, {"--ckpt-convert-save", "d"}})
    EXPECT_NE(testing::user_error_of([&] { train::parse_flags(f); }).find("moecore convert hf-to-native"),
              std::string::npos)
        << f[0];
  // --save-interval without --save: accepted, as Megatron does (nothing is saved).
  EXPECT_EQ(testing::error_of([&] {
              train::parse_train_config(megatron_tiny_run() + std::vector<std::string>{"--save-interval", "5"});
            }),
            "");
}

TEST(MegatronFlags, YamlKeysTakeTheRulesToo) {
  const std::string y = testing::fresh_temp_path("megatron_flags_yaml") + ".yaml";
  std::ofstream(y) << "use_mcore_models: true\ntransformer-impl: local\nno_rope_fusion: false\n";
  const auto c = train::parse_train_config(megatron_tiny_run() + std::vector<std::string>{"--config", y});
  ASSERT_EQ(c.no_effect.size(), 2u);  // a switch set to false is not given
  EXPECT_EQ(c.no_effect[0].rfind("--use-mcore-models: ", 0), 0u);
  EXPECT_EQ(c.no_effect[1].rfind("--transformer-impl local: ", 0), 0u);
  std::ofstream(y) << "batch_invariant_mode: true\n";
  EXPECT_EQ(testing::user_error_of([&] {
              train::parse_flags({"--config", y});
            }).rfind("--batch-invariant-mode true: ", 0),
            0u);
  std::ofstream(y) << "batch_invariant_mode: false\n";
  EXPECT_EQ(testing::error_of([&] { train::parse_flags({"--config", y}); }), "");
}

TEST(MegatronFlags, HelpStaysReadableAndDocsListEveryFlag) {
  std::string help;
  try {
    train::parse_flags({"--help"});
  } catch (const train::HelpRequested& h) {
    help = h.text;
  }
  EXPECT_NE(help.find("Megatron-LM's other flags are accepted too"), std::string::npos);
  EXPECT_EQ(help.find("--use-mcore-models"), std::string::npos);  // hidden: moecore flags lists them
  EXPECT_NE(help.find("--ckpt-format"), std::string::npos);
  const std::string md = train::megatron_flags_markdown();
  for (const auto& f : train::megatron_flags())
    EXPECT_NE(md.find("| `--" + f.name + "` | "), std::string::npos) << f.name;
  EXPECT_EQ(md.find("| unknown |"), std::string::npos);
  EXPECT_NE(md.find("| `--batch-invariant-mode` | refused | batch-invariant kernels"), std::string::npos);
  EXPECT_NE(md.find("| `--lr` | implemented | "), std::string::npos);
}

}  // namespace
}  // namespace moecore
