// Megatron's OptimizerParamScheduler from the flags: hand-computed learning rates and weight decays at chosen
// steps for each form (iterations and samples give the same values; warmup fraction; warmup init; WSD;
// inverse-square-root; weight-decay increase), --train-samples deriving the iterations, and Megatron's argument
// checks between these flags.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>

#include "config_util.h"
#include "test_util.h"

namespace moecore {
namespace {

using testing::operator+;
using testing::error_of;

// The tiny model on mock data with a global batch of 4, no length yet (--train-iters or --train-samples).
std::vector<std::string> base() {
  return testing::tiny_moe_flags() + std::vector<std::string>{"--seq-length",
                                                              "16",
                                                              "--micro-batch-size",
                                                              "2",
                                                              "--global-batch-size",
                                                              "4",
                                                              "--mock-data",
                                                              "--vocab-size",
                                                              "100",
                                                              "--eval-iters",
                                                              "0",
                                                              "--lr",
                                                              "1",
                                                              "--min-lr",
                                                              "0.1"};
}
train::TrainConfig iters(const std::vector<std::string>& extra) {
  return testing::small_config(base() + std::vector<std::string>{"--train-iters", "100"}, extra);
}
train::TrainConfig samples(const std::vector<std::string>& extra) {
  return testing::small_config(base() + std::vector<std::string>{"--train-samples", "400"}, extra);
}

// The scheduler counts samples: step k of the trainer is sample 4k.
TEST(Schedule, IterationsAndSamplesGiveTheSameRates) {
  const auto a =
      train::lr_schedule(iters({"--lr-decay-style", "cosine", "--lr-warmup-iters", "10", "--lr-decay-iters", "80"}));
  const auto bc = samples({"--lr-decay-style", "cosine", "--lr-warmup-samples", "40", "--lr-decay-samples", "320"});
  EXPECT_EQ(bc.train_iters, 100);
  const auto b = train::lr_schedule(bc);
  for (int64_t k = 0; k <= 100; k++) EXPECT_EQ(a.lr(4 * k), b.lr(4 * k)) << "iteration " << k;
  EXPECT_DOUBLE_EQ(a.lr(0), 0.0);
  EXPECT_DOUBLE_EQ(a.lr(20), 0.5);  // half the warmup
  EXPECT_DOUBLE_EQ(a.lr(40), 1.0);
  EXPECT_NEAR(a.lr(180), 0.1 + 0.9 * 0.5, 1e-15);  // (180 - 40) / (320 - 40) = 1/2: cos(pi/2) = 0
  EXPECT_DOUBLE_EQ(a.lr(400), 0.1);
  const auto lin = train::lr_schedule(iters({"--lr-warmup-iters", "10", "--lr-decay-iters", "80"}));
  EXPECT_NEAR(lin.lr(110), 0.1 + 0.9 * 0.75, 1e-15);  // (110 - 40) / 280 = 1/4
  // Megatron's train_iters = train_samples // global batch.
  EXPECT_EQ(testing::small_config(base() + std::vector<std::string>{"--train-samples", "402"}).train_iters, 100);
  // Weight decay over the training: iterations x batch, or --train-samples.
  EXPECT_EQ(a.wd_incr_steps, 400);
  EXPECT_EQ(b.wd_incr_steps, 400);
}

TEST(Schedule, WarmupFractionAndInit) {
  // A quarter of the 320 decay samples: 80 samples of warmup, in either form.
  for (const auto& c : {iters({"--lr-warmup-fraction", "0.25", "--lr-decay-iters", "80"}),
                        samples({"--lr-warmup-fraction", "0.25", "--lr-decay-samples", "320"})}) {
    const auto s = train::lr_schedule(c);
    EXPECT_DOUBLE_EQ(s.warmup_iters, 80.0);
    EXPECT_DOUBLE_EQ(s.lr(40), 0.5);
    EXPECT_DOUBLE_EQ(s.lr(80), 1.0);
    EXPECT_NEAR(s.lr(200), 0.1 + 0.9 * 0.5, 1e-15);  // linear: (200 - 80) / (320 - 80)
  }
  // A fractional warmup (0.3 x 320 = 96 samples) compares and divides as a float.
  const auto f = train::lr_schedule(iters({"--lr-warmup-fraction", "0.3", "--lr-decay-iters", "80"}));
  EXPECT_NEAR(f.lr(48), 0.5, 1e-15);
  // --lr-warmup-init: the warmup starts there.
  const auto w = train::lr_schedule(iters({"--lr-warmup-iters", "10", "--lr-warmup-init", "0.2"}));
  EXPECT_DOUBLE_EQ(w.lr(0), 0.2);
  EXPECT_DOUBLE_EQ(w.lr(20), 0.2 + 0.8 * 0.5);
  EXPECT_DOUBLE_EQ(w.lr(40), 1.0);
}

TEST(Schedule, WsdAndInverseSquareRoot) {
  // Decay ends at 320 samples, the last 80 anneal: stable until 240.
  const auto a =
      train::lr_schedule(iters({"--lr-decay-style", "WSD", "--lr-wsd-decay-style", "linear", "--lr-warmup-iters", "10",
                                "--lr-decay-iters", "80", "--lr-wsd-decay-iters", "20"}));
  const auto b =
      train::lr_schedule(samples({"--lr-decay-style", "WSD", "--lr-wsd-decay-style", "linear", "--lr-warmup-samples",
                                  "40", "--lr-decay-samples", "320", "--lr-wsd-decay-samples", "80"}));
  for (int64_t k = 0; k <= 100; k++) EXPECT_EQ(a.lr(4 * k), b.lr(4 * k)) << "iteration " << k;
  EXPECT_DOUBLE_EQ(a.lr(200), 1.0);
  EXPECT_DOUBLE_EQ(a.lr(240), 1.0);
  EXPECT_NEAR(a.lr(280), 0.1 + 0.9 * 0.5, 1e-15);
  EXPECT_DOUBLE_EQ(a.lr(321), 0.1);
  const auto e = train::lr_schedule(iters(
      {"--lr-decay-style", "WSD", "--lr-decay-iters", "80", "--lr-wsd-decay-iters", "20"}));  // exponential by default
  EXPECT_NEAR(e.lr(280), 0.1 + 0.9 * (2 * std::pow(0.5, 0.5) - 1), 1e-15);
  // inverse-square-root: max_lr * sqrt(warmup / step) after the warmup, never below --min-lr.
  const auto r = train::lr_schedule(
      iters({"--lr-decay-style", "inverse-square-root", "--lr-warmup-iters", "10", "--lr-decay-iters", "80"}));
  EXPECT_NEAR(r.lr(160), 0.5, 1e-15);
  EXPECT_NEAR(r.lr(250), 0.4, 1e-15);
  EXPECT_DOUBLE_EQ(r.lr(330), 0.1);  // past the decay
}

TEST(Schedule, WeightDecayIncrease) {
  const auto c = train::lr_schedule(iters({"--weight-decay", "0.05"}));
  EXPECT_DOUBLE_EQ(c.wd(0), 0.05);
  EXPECT_DOUBLE_EQ(c.wd(399), 0.05);
  const auto l = train::lr_schedule(
      iters({"--weight-decay-incr-style", "linear", "--start-weight-decay", "0.0", "--end-weight-decay", "0.1"}));
  EXPECT_DOUBLE_EQ(l.wd(0), 0.0);
  EXPECT_DOUBLE_EQ(l.wd(200), 0.05);
  EXPECT_DOUBLE_EQ(l.wd(500), 0.1);
  const auto k = train::lr_schedule(
      samples({"--weight-decay-incr-style", "cosine", "--start-weight-decay", "0.0", "--end-weight-decay", "0.1"}));
  EXPECT_NEAR(k.wd(100), 0.1 * 0.5 * (std::cos(M_PI * 0.75) + 1), 1e-15);  // 1/4 of 400 samples
  EXPECT_NEAR(k.wd(200), 0.05, 1e-15);
}

TEST(Schedule, MegatronsChecksBetweenTheFlags) {
  auto refused = [](const std::function<void()>& f, const std::string& what) {
    const std::string e = error_of(f);
    EXPECT_NE(e.find(what), std::string::npos) << "expected '" << what << "' in: " << e;
  };
  refused([] { iters({"--train-samples", "400"}); }, "--train-iters 100 and --train-samples 400 are exclusive");
  refused([] { samples({"--lr-decay-iters", "10"}); }, "--lr-decay-iters 10 with --train-samples");
  refused([] { samples({"--lr-warmup-iters", "10"}); }, "--lr-warmup-iters 10 with --train-samples");
  refused([] { samples({"--lr-wsd-decay-iters", "10"}); }, "--lr-wsd-decay-iters 10 with --train-samples");
  refused([] { iters({"--lr-decay-samples", "10"}); }, "--lr-decay-samples 10 needs --train-samples");
  refused([] { iters({"--lr-warmup-samples", "10"}); }, "--lr-warmup-samples 10 needs --train-samples");
  refused([] { iters({"--lr-warmup-fraction", "0.1", "--lr-warmup-iters", "2"}); }, "are exclusive");
  refused([] { samples({"--lr-warmup-fraction", "0.1", "--lr-warmup-samples", "2"}); }, "are exclusive");
  refused([] { iters({"--lr-warmup-fraction", "1"}); }, "--lr-warmup-fraction 1 must be in [0, 1)");
  refused([] { samples({"--train-samples", "3"}); }, "less than one global batch");
  refused([] { iters({"--lr-warmup-iters", "100"}); }, "must be shorter than the decay");
  refused([] { iters({"--lr-warmup-init", "2"}); }, "--lr-warmup-init 2 must be in [0, --lr 1]");
  refused([] { iters({"--start-weight-decay", "0.1"}); }, "need --weight-decay-incr-style linear or cosine");
  refused([] { iters({"--weight-decay-incr-style", "linear"}); }, "needs --start-weight-decay and");
  refused(
      [] {
        iters({"--weight-decay-incr-style", "linear", "--start-weight-decay", "0.2", "--end-weight-decay", "0.1"});
      },
      "at most --end-weight-decay");
  refused([] { iters({"--use-checkpoint-opt_param-scheduler", "--override-opt_param-scheduler"}); }, "exclusive");
  refused(
      [] {
        iters({"--rampup-batch-size", "4", "4", "100"});
      },
      "--rampup-batch-size 4 4 100: batch-size rampup is not supported");
  refused([] { iters({"--eod-mask-loss"}); }, "--eod-mask-loss needs a --tokenizer-type");
  refused([] { iters({"--lr-decay-style", "WSD"}); }, "needs the anneal length");
  // Accepted: the all-dash spelling Megatron also takes, and the YAML key with underscores.
  EXPECT_TRUE(iters({"--use-checkpoint-opt-param-scheduler"}).use_checkpoint_opt_param_scheduler);
  EXPECT_TRUE(iters({"--override-opt_param-scheduler"}).override_opt_param_scheduler);
  const std::string yaml = testing::fresh_temp_path("schedule_flags") + ".yaml";
  std::ofstream(yaml) << "override_opt_param_scheduler: true\nlr_warmup_init: 0.5\n";
  const auto y = iters({"--config", yaml});
  EXPECT_TRUE(y.override_opt_param_scheduler);
  EXPECT_DOUBLE_EQ(y.lr_warmup_init, 0.5);
  std::remove(yaml.c_str());
}

}  // namespace
}  // namespace moecore
