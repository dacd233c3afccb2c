// moecore train: configuration (presets, YAML, flags, rejections), Megatron's LR schedules on hand values, loss
// falling on real preprocessed text, N micro-batches of accumulation equal to one N-times larger batch, bitwise
// reruns, and a steady-state step that allocates nothing.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "config_util.h"
#include "moecore/core/allocator.h"
#include "moecore/data/bpe_trainer.h"
#include "moecore/data/preprocess.h"
#include "moecore/data/tokenizer.h"
#include "moecore/kernels/gemm.h"
#include "moecore/train/config/presets.h"
#include "moecore/train/trainer.h"
#include "test_util.h"

namespace moecore {
namespace {

namespace fs = std::filesystem;
using testing::operator+;
using train::TrainConfig;

TrainConfig parse(const std::vector<std::string>& a) {
  return train::parse_train_config(a);
}

std::string train_error(const std::vector<std::string>& a) {
  try {
    parse(a);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(TrainConfig, PresetsYamlAndFlagsInOrder) {
  const TrainConfig c = parse({"--model", "tiny-moe", "--mock-data", "--vocab-size", "100", "--train-iters", "50",
                               "--num-layers", "3", "--lr-warmup-iters", "5"});
  EXPECT_EQ(c.num_experts, 8);      // from the preset
  EXPECT_EQ(c.num_layers, 3);       // flag overrides preset
  EXPECT_EQ(c.lr_decay_iters, 50);  // defaults to --train-iters
  EXPECT_EQ(c.kv_channels, 64);     // H / heads
  const fs::path y = fs::path(testing::process_temp_path("train_cfg.yaml"));
  std::ofstream(y) << "model: deepseek-v3\nnum_layers: 4\nmoe-router-topk: 2\nmock-data: true\nvocab-size: 64\n"
                      "train-iters: 10\nmoe-router-load-balancing-type: [aux_loss, seq_aux_loss]\n"
                      "moe-aux-loss-coeff: [0.01, 0.001]\n";
  const TrainConfig d = parse({"--config", y.string(), "--moe-router-topk", "4"});
  EXPECT_EQ(d.moe_router_score_function, "sigmoid");  // preset named in YAML
  EXPECT_EQ(d.moe_router_topk, 4);                    // flag beats YAML
  EXPECT_EQ(d.moe_router_load_balancing_type.size(), 2u);
  EXPECT_EQ(d.moe_layer_freq, "([0]*1+[1]*3)");
  for (const auto& m : train::preset_names())
    EXPECT_EQ(train_error({"--model", m, "--mock-data", "--vocab-size", "64", "--train-iters", "100"}), "") << m;
  std::ofstream(y) << "num-layerz: 3\n";
  EXPECT_NE(train_error({"--config", y.string()}).find("unknown key 'num-layerz'"), std::string::npos);
}

TEST(TrainConfig, RejectsBeforeAnyWork) {
  const std::vector<std::string> base{"--mock-data", "--vocab-size", "64", "--train-iters", "10"};
  auto with = [&](std::vector<std::string> extra) {
    auto a = base;
    a.insert(a.end(), extra.begin(), extra.end());
    return train_error(a);
  };
  EXPECT_NE(with({"--no-such-flag"}).find("--no-such-flag"), std::string::npos);
  EXPECT_NE(with({"--data-path", "x"}).find("exactly one of --data-path and --mock-data"), std::string::npos);
  EXPECT_NE(with({"--tensor-model-parallel-size", "2"}).find("needs --sequence-parallel"), std::string::npos);
  EXPECT_NE(with({"--tensor-model-parallel-size", "2", "--sequence-parallel"}).find("--disable-bias-linear"),
            std::string::npos);
  EXPECT_NE(with({"--tensor-model-parallel-size", "3", "--sequence-parallel", "--disable-bias-linear"})
                .find("divisible by --tensor-model-parallel-size 3"),
            std::string::npos);
  EXPECT_NE(with({"--context-parallel-size", "2", "--cp-comm-type", "a2a+p2p"})
                .find("needs --hierarchical-context-parallel-sizes"),
            std::string::npos);
  EXPECT_NE(with({"--num-experts", "4", "--disable-bias-linear", "--moe-ffn-hidden-size", "63",
                  "--expert-tensor-parallel-size", "2"})
                .find("--expert-tensor-parallel-size 2"),
            std::string::npos);
  EXPECT_EQ(with({"--num-experts", "4"}), "");  // Megatron's default linear biases, the experts' included
  EXPECT_NE(with({"--num-experts", "4", "--expert-tensor-parallel-size", "2"}).find("--disable-bias-linear"),
            std::string::npos);
  EXPECT_EQ(with({"--save-interval", "5"}), "");  // Megatron accepts it too: nothing is saved without --save
  EXPECT_NE(with({"--finetune"}).find("--finetune needs --load"), std::string::npos);
  EXPECT_NE(with({"--no-load-optim"}).find("--no-load-optim needs --load"), std::string::npos);
  EXPECT_NE(with({"--fault-kill-during-save", "3"}).find("RANK:ITERATION"), std::string::npos);
  EXPECT_NE(with({"--micro-batch-size", "3", "--global-batch-size", "8"}).find("multiple"), std::string::npos);
  EXPECT_NE(
      with({"--normalization", "L2Norm"}).find("--normalization L2Norm is not accepted; one of: LayerNorm, RMSNorm"),
      std::string::npos);
  EXPECT_NE(with({"--position-embedding-type", "yarn"}).find("--position-embedding-type yarn is not accepted"),
            std::string::npos);
  // Megatron: --no-position-embedding is deprecated, accepted only with rope (where it changes nothing).
  EXPECT_NE(with({"--no-position-embedding"}).find("use --position-embedding-type none"), std::string::npos);
  EXPECT_EQ(with({"--no-position-embedding", "--position-embedding-type", "rope"}), "");
  EXPECT_NE(with({"--num-attention-heads", "3"}).find("divisible"), std::string::npos);
  EXPECT_NE(with({"--lr-decay-style", "step"}).find("--lr-decay-style step"), std::string::npos);
  EXPECT_NE(with({"--num-experts", "4", "--disable-bias-linear", "--moe-router-topk", "1"}).find("pre-softmax"),
            std::string::npos);
  EXPECT_NE(with({"--num-experts", "4", "--disable-bias-linear", "--moe-layer-freq", "[1,0,1]"}).find("--num-layers"),
            std::string::npos);
  EXPECT_NE(with({"--seq-length", "x"}).find("integer"), std::string::npos);
  EXPECT_NE(train_error({"--train-iters", "10"}).find("--data-path"), std::string::npos);
  EXPECT_NE(train_error({"--mock-data", "--train-iters", "10"}).find("--vocab-size"), std::string::npos);
  EXPECT_NE(with({"--tokenizer-type", "HuggingFaceTokenizer"}).find("--tokenizer-model"), std::string::npos);
  EXPECT_NE(with({"--tokenizer-type", "GPT2BPETokenizer"}).find("GPT2BPETokenizer"), std::string::npos);
  EXPECT_NE(with({"--swiglu", "--squared-relu"}).find("exclusive"), std::string::npos);
  EXPECT_NE(with({"--seq-length", "512", "--max-position-embeddings", "256"}).find("below --seq-length"),
            std::string::npos);
  EXPECT_NE(with({"--moe-ffn-hidden-size", "64"}).find("--num-experts is 0"), std::string::npos);
  EXPECT_NE(with({"--eval-iters", "-1"}).find("--eval-iters"), std::string::npos);
  EXPECT_NE(with({"--optimizer", "lion"}).find("lion"), std::string::npos);
  EXPECT_NE(with({"--lr", "1e-3", "--min-lr", "1e-2"}).find("--min-lr"), std::string::npos);
  EXPECT_NE(with({"--lr-decay-style", "WSD"}).find("--lr-wsd-decay-iters"), std::string::npos);
  EXPECT_NE(with({"--num-experts", "4", "--disable-bias-linear", "--moe-router-num-groups", "3",
                  "--moe-router-group-topk", "1"})
                .find("divisible"),
            std::string::npos);
  EXPECT_NE(with({"--num-experts", "4", "--disable-bias-linear", "--moe-router-enable-expert-bias"}).find("sigmoid"),
            std::string::npos);
  EXPECT_NE(with({"--num-experts", "4", "--disable-bias-linear", "--moe-router-load-balancing-type", "aux_loss",
                  "seq_aux_loss"})
                .find("one coefficient per"),
            std::string::npos);
  EXPECT_NE(with({"--model", "gpt-9"}).find("not a preset"), std::string::npos);
  EXPECT_NE(with({"--moe-token-drop-policy", "random", "--num-experts", "4", "--disable-bias-linear"}).find("random"),
            std::string::npos);
}

TEST(LRSchedule, MegatronValues) {
  optim::LRSchedule s;
  s.max_lr = 1.0;
  s.min_lr = 0.1;
  s.warmup_iters = 10;
  s.decay_iters = 110;
  s.style = "cosine";
  EXPECT_DOUBLE_EQ(s.lr(0), 0.0);  // the first step runs at the warmup start, as in Megatron
  EXPECT_DOUBLE_EQ(s.lr(5), 0.5);
  EXPECT_DOUBLE_EQ(s.lr(10), 1.0);
  EXPECT_NEAR(s.lr(60), 0.1 + 0.9 * 0.5, 1e-15);  // halfway: cos(pi/2) = 0
  EXPECT_DOUBLE_EQ(s.lr(200), 0.1);
  s.style = "linear";
  EXPECT_NEAR(s.lr(35), 0.1 + 0.9 * 0.75, 1e-15);
  s.style = "constant";
  EXPECT_DOUBLE_EQ(s.lr(90), 1.0);
  s.style = "WSD";
  s.wsd_decay_iters = 20;  // stable until 90, then anneal
  s.wsd_style = "linear";
  EXPECT_DOUBLE_EQ(s.lr(80), 1.0);
  EXPECT_NEAR(s.lr(100), 0.1 + 0.9 * 0.5, 1e-15);
  s.wsd_style = "exponential";
  EXPECT_NEAR(s.lr(100), 0.1 + 0.9 * (2 * std::pow(0.5, 0.5) - 1), 1e-15);
  s.wsd_style = "minus_sqrt";
  EXPECT_NEAR(s.lr(100), 0.1 + 0.9 * (1 - std::sqrt(0.5)), 1e-15);
}

// A small real corpus: fortunes, a trained BPE vocabulary, preprocessed like the demo.
struct RealData {
  std::string prefix, tokenizer_dir;
};

RealData real_data() {
  const fs::path d = fs::path(testing::process_temp_path("train_data"));
  RealData r{(d / "f_text_document").string(), (d / "tok").string()};
  // Built once per process. A directory of the same name can be left by an earlier process with the same pid that
  // was killed while writing it, so the first call here never trusts one.
  static bool built = false;
  if (built) return r;
  built = true;
  fs::remove_all(d);
  fs::create_directories(d / "tok");
  std::ifstream in("/usr/share/games/fortunes/fortunes");
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  std::ofstream j(d / "in.jsonl");
  std::string corpus;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find("\n%\n", pos);
    if (end == std::string::npos) end = text.size();
    const std::string f = text.substr(pos, end - pos + 1);
    j << nlohmann::json({{"text", f}}).dump() << "\n";
    corpus += f;
    pos = end + 3;
  }
  j.close();
  std::ofstream(d / "tok/tokenizer.json") << data::train_bpe_tokenizer_json(corpus, 512, {"<|endoftext|>"});
  std::ofstream(d / "tok/tokenizer_config.json") << "{\"eos_token\": \"<|endoftext|>\"}";
  data::PreprocessOptions o;
  o.input = (d / "in.jsonl").string();
  o.output_prefix = (d / "f").string();
  o.tokenizer_model = r.tokenizer_dir;
  o.append_eod = true;
  data::preprocess(o);
  return r;
}

std::vector<std::string> small_moe_args(const RealData& r, int64_t iters, const std::string& aux = "1e-2") {
  return train::override_flags(testing::tiny_moe_flags(), {"--hidden-size", "64", "--moe-ffn-hidden-size", "64"}) +
         std::vector<std::string>{"--moe-aux-loss-coeff",
                                  aux,
                                  "--seq-length",
                                  "64",
                                  "--micro-batch-size",
                                  "4",
                                  "--global-batch-size",
                                  "8",
                                  "--lr",
                                  "3e-3",
                                  "--lr-warmup-iters",
                                  "3",
                                  "--lr-decay-style",
                                  "cosine",
                                  "--train-iters",
                                  std::to_string(iters),
                                  "--data-path",
                                  r.prefix,
                                  "--tokenizer-type",
                                  "HuggingFaceTokenizer",
                                  "--tokenizer-model",
                                  r.tokenizer_dir,
                                  "--eval-iters",
                                  "2",
                                  "--log-interval",
                                  "1000",
                                  "--eval-interval",
                                  "1000"};
}

TEST(Train, LossFallsOnRealText) {
  const RealData r = real_data();
  std::FILE* null = std::fopen("/dev/null", "w");
  train::Trainer t(parse(small_moe_args(r, 40)), null, false);
  const double v0 = t.evaluate(2);
  double first = 0, last = 0;
  for (int i = 0; i < 40; i++) {
    const auto s = t.train_step();
    if (i == 0) first = s.lm_loss;
    last = s.lm_loss;
    EXPECT_TRUE(std::isfinite(s.grad_norm));
  }
  const double v1 = t.evaluate(2);
  EXPECT_LT(last, first - 1.0) << "training loss must fall";
  EXPECT_LT(v1, v0 - 1.0) << "validation loss must fall";
  EXPECT_LT(v1, t.unigram_entropy()) << "the model must beat the unigram distribution";
  std::fclose(null);
}

TEST(Train, AccumulationEqualsOneLargerBatch) {
  const RealData r = real_data();
  std::FILE* null = std::fopen("/dev/null", "w");
  // Aux losses are per micro-batch statistics, so they are off here: the LM gradient must be identical.
  auto args = small_moe_args(r, 6, "0");
  const auto one = train::override_flags(args, {"--micro-batch-size", "8"});
  train::Trainer a(parse(args), null, false), b(parse(one), null, false);
  for (int i = 0; i < 3; i++) {
    const auto sa = a.train_step(), sb = b.train_step();
    EXPECT_NEAR(sa.lm_loss, sb.lm_loss, 1e-5 * sb.lm_loss) << "step " << i;
    EXPECT_NEAR(sa.grad_norm, sb.grad_norm, 1e-4 * sb.grad_norm) << "step " << i;
  }
  std::fclose(null);
}

TEST(Train, RerunIsBitwiseIdenticalAndSteadyStateAllocatesNothing) {
  const RealData r = real_data();
  std::FILE* null = std::fopen("/dev/null", "w");
  const TrainConfig c = parse(small_moe_args(r, 12));
  train::Trainer a(c, null, false), b(c, null, false);
  for (int i = 0; i < 3; i++) {
    const auto sa = a.train_step(), sb = b.train_step();
    EXPECT_EQ(sa.lm_loss, sb.lm_loss);
    EXPECT_EQ(sa.grad_norm, sb.grad_norm);
  }
  // The experts' GEMMs take a primitive per row count (and per beta: a step's first weight-gradient GEMM into a
  // stale gradient overwrites it): a few more steps meet most row counts this routing produces. A row count first
  // met later (the routing's last bits differ between compilers) adds its one primitive; a key met before never
  // makes another, and nothing else is created.
  for (int i = 0; i < 6; i++) a.train_step();
  const AllocatorMark mark = Allocator::instance().mark();
  const int64_t prims = kernels::gemm_stats().primitives_created;
  const size_t keys = kernels::gemm_shape_stats().size();
  a.train_step();
  a.train_step();
  EXPECT_EQ(Allocator::instance().system_allocs_since(mark), 0);
  const int64_t new_keys = static_cast<int64_t>(kernels::gemm_shape_stats().size() - keys);
  EXPECT_EQ(kernels::gemm_stats().primitives_created - prims, new_keys);
  EXPECT_LE(new_keys, 16) << "the experts' row counts should mostly repeat by now";
  std::fclose(null);
}

}  // namespace
}  // namespace moecore
