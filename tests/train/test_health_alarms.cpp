// Routing and loss health alarms (train/routing_health): each detector on synthetic steps (episodes, thresholds,
// warm-ups), then each alarm provoked in a tiny run (a router steered by its expert bias), warning once and
// writing an "alarm" record, or stopping before the step is saved; the flags' checks.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <nlohmann/json.hpp>

#include "config_util.h"
#include "moecore/moe/moe_layer.h"
#include "moecore/train/observe/routing_health.h"
#include "moecore/train/trainer.h"
#include "test_util.h"

namespace moecore {
namespace {

using testing::operator+;

// Every alarm off but the ones `extra` turns on.
train::TrainConfig quiet(const std::vector<std::string>& extra) {
  return testing::small_config(
      testing::tiny_moe_flags() + testing::mock_run_flags(16, 2, 2, 64, 4, "1e-3") +
          std::vector<std::string>{"--moe-dead-expert-steps", "0", "--moe-load-imbalance-threshold", "0",
                                   "--moe-router-entropy-collapse-fraction", "0", "--moe-aux-loss-spike-factor", "0",
                                   "--loss-spike-factor", "0"},
      extra);
}

train::LayerRouting layer(std::vector<double> tokens, double entropy = 1.0) {
  return {1, std::move(tokens), entropy};
}

std::vector<std::string> names(const std::vector<train::Alarm>& a) {
  std::vector<std::string> n;
  for (const auto& x : a) n.push_back(x.name);
  return n;
}

TEST(HealthAlarms, DeadExpertWarnsOncePerEpisodeNamingLayerExpertAndRank) {
  const auto c = quiet({"--moe-dead-expert-steps", "3"});
  train::HealthAlarms h(c, 2);
  train::StepResult r;
  EXPECT_TRUE(h.after_step(1, r, {layer({4, 4, 0, 0})}).empty());
  EXPECT_TRUE(h.after_step(2, r, {layer({4, 4, 0, 0})}).empty());
  const auto a = h.after_step(3, r, {layer({4, 4, 0, 0})});
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].name, "dead-expert");
  EXPECT_FALSE(a[0].stop);
  EXPECT_NE(a[0].message.find("iteration 3: layer 1: expert 2 (on expert-parallel rank 1), expert 3 (on "
                              "expert-parallel rank 1) received no tokens for 3 steps"),
            std::string::npos)
      << a[0].message;
  EXPECT_TRUE(h.after_step(4, r, {layer({4, 4, 0, 0})}).empty());  // once per episode
  EXPECT_TRUE(h.after_step(5, r, {layer({4, 4, 1, 0})}).empty());  // expert 2 back; expert 3 still dead
  for (int64_t it = 6; it <= 7; it++) EXPECT_TRUE(h.after_step(it, r, {layer({4, 4, 0, 1})}).empty());
  EXPECT_EQ(names(h.after_step(8, r, {layer({4, 4, 0, 1})})), std::vector<std::string>{"dead-expert"});
}

TEST(HealthAlarms, LoadImbalanceAndEntropyCollapseNeedTheirStepsInARow) {
  const auto c = quiet({"--moe-load-imbalance-threshold", "2", "--moe-load-imbalance-steps", "2",
                        "--moe-router-entropy-collapse-fraction", "0.5", "--moe-router-entropy-collapse-steps", "2"});
  train::HealthAlarms h(c, 1);
  train::StepResult r;
  const double low = 0.4 * std::log(4.0), high = 0.6 * std::log(4.0);
  EXPECT_TRUE(h.after_step(1, r, {layer({9, 1, 1, 1}, low)}).empty());   // 3x mean, entropy low: 1 step
  EXPECT_TRUE(h.after_step(2, r, {layer({2, 2, 2, 2}, high)}).empty());  // both clear
  EXPECT_TRUE(h.after_step(3, r, {layer({9, 1, 1, 1}, low)}).empty());
  const auto a = h.after_step(4, r, {layer({1, 9, 1, 1}, low)});
  ASSERT_EQ(names(a), (std::vector<std::string>{"load-imbalance", "router-entropy-collapse"}));
  EXPECT_NE(a[0].message.find("max/mean expert load 3.00 (the busiest: expert 1)"), std::string::npos) << a[0].message;
  EXPECT_NE(a[1].message.find("below --moe-router-entropy-collapse-fraction 0.5 x ln(4)"), std::string::npos)
      << a[1].message;
  EXPECT_TRUE(h.after_step(5, r, {layer({9, 1, 1, 1}, low)}).empty());  // once per episode
  // 2x the mean is not above the threshold 2
  train::HealthAlarms h2(c, 1);
  for (int64_t it = 1; it <= 3; it++) EXPECT_TRUE(h2.after_step(it, r, {layer({4, 2, 1, 1}, high)}).empty());
}

TEST(HealthAlarms, LossSpikeFollowsMegatronsRuleAfterTheFirstStep) {
  const auto c = quiet({"--loss-spike-factor", "10", "--loss-spike-samples", "3"});
  train::HealthAlarms h(c, 1);
  train::StepResult r;
  r.lm_loss = 500;  // the first step is not sampled (Megatron validates nothing on a process's first iteration)
  EXPECT_TRUE(h.after_step(1, r, {}).empty());
  for (double v : {2.0, -3.0, 1.0}) {  // the max |loss| of 3 samples: 3
    r.lm_loss = v;
    EXPECT_TRUE(h.after_step(2, r, {}).empty());
  }
  r.lm_loss = 29.9;
  EXPECT_TRUE(h.after_step(5, r, {}).empty());
  r.lm_loss = 30;  // >= 10 x 3
  const auto a = h.after_step(6, r, {});
  ASSERT_EQ(names(a), std::vector<std::string>{"loss-spike"});
  EXPECT_NE(a[0].message.find("iteration 6: lm loss 30 is >= --loss-spike-factor 10 x 3"), std::string::npos)
      << a[0].message;
  EXPECT_TRUE(h.after_step(7, r, {}).empty());  // the same episode
  r.lm_loss = std::nan("");                     // non-finite values are the NaN check's
  EXPECT_EQ(names(h.after_step(8, r, {})), std::vector<std::string>{"nan"});
  r.lm_loss = 1;
  EXPECT_TRUE(h.after_step(9, r, {}).empty());
  r.lm_loss = 31;  // a new episode
  EXPECT_EQ(names(h.after_step(10, r, {})), std::vector<std::string>{"loss-spike"});
}

TEST(HealthAlarms, AuxLossSpikePerLayerAfterItsWarmUp) {
  const auto c = quiet({"--moe-aux-loss-spike-factor", "3", "--moe-aux-loss-spike-samples", "2", "--health-alarm-stop",
                        "aux-loss-spike"});
  train::HealthAlarms h(c, 1);
  train::StepResult r;
  const std::vector<train::LayerRouting> routing = {{0, {}, 0}, {1, {}, 0}};
  r.aux_layers = {{1.0, 1.0}};
  EXPECT_TRUE(h.after_step(1, r, routing).empty());
  r.aux_layers = {{1.1, 0.9}};
  EXPECT_TRUE(h.after_step(2, r, routing).empty());
  r.aux_layers = {{3.4, 2.6}};  // layer 0: 3.4 >= 3 x 1.1; layer 1: 2.6 < 3 x 1.0
  const auto a = h.after_step(3, r, routing);
  ASSERT_EQ(names(a), std::vector<std::string>{"aux-loss-spike"});
  EXPECT_TRUE(a[0].stop);
  EXPECT_NE(a[0].message.find("iteration 3: layer 0: its aux_loss 3.4 is >= --moe-aux-loss-spike-factor 3 x 1.1"),
            std::string::npos)
      << a[0].message;
}

// --- provoked in tiny runs ---

// The tiny MoE model with a sigmoid router whose expert bias (fixed: update rate 0) steers selection.
train::TrainConfig steered(const std::vector<std::string>& extra) {
  return quiet(std::vector<std::string>{"--moe-router-score-function", "sigmoid", "--moe-router-enable-expert-bias",
                                        "--moe-router-bias-update-rate", "0", "--moe-aux-loss-coeff", "1e-2"} +
               extra);
}
// Expert 0 of every MoE layer takes every token; expert 3 none; router weights x1000 saturate the sigmoid scores
// (the per-token router entropy collapses from about ln 4 to ln of the experts scored ~1).
void steer(train::Trainer& t) {
  for (moe::MoELayer* l : t.moe_layers()) {
    l->router().expert_bias().set_item(0, 1e4);
    l->router().expert_bias().set_item(3, -1e4);
    Tensor& w = l->router().weight().value;
    for (int64_t i = 0; i < w.numel(); i++) w.set_item(i, 1e3 * w.item(i));
  }
}
std::string read_all(const std::string& path) {
  std::ifstream f(path);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}
size_t count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) n++;
  return n;
}
std::vector<nlohmann::json> alarms_in(const std::string& jsonl) {
  std::vector<nlohmann::json> v;
  std::ifstream f(jsonl);
  for (std::string line; std::getline(f, line);)
    if (auto j = nlohmann::json::parse(line); j.contains("alarm")) v.push_back(j);
  return v;
}

TEST(HealthAlarms, EveryRoutingAndLossAlarmWarnsOnceInARun) {
  const std::string log = testing::fresh_temp_path("alarms_log"), jsonl = testing::fresh_temp_path("alarms_jsonl");
  std::FILE* out = std::fopen(log.c_str(), "w");
  {
    train::Trainer t(steered({"--train-iters",
                              "5",
                              "--metrics-file",
                              jsonl,
                              "--moe-dead-expert-steps",
                              "2",
                              "--moe-load-imbalance-threshold",
                              "1.5",
                              "--moe-load-imbalance-steps",
                              "2",
                              "--moe-router-entropy-collapse-fraction",
                              "1",
                              "--moe-router-entropy-collapse-steps",
                              "3",
                              "--moe-aux-loss-spike-factor",
                              "0.5",
                              "--moe-aux-loss-spike-samples",
                              "1",
                              "--loss-spike-factor",
                              "0.5",
                              "--loss-spike-samples",
                              "1"}),
                     out, false);
    steer(t);
    t.run();
  }
  std::fclose(out);
  const std::string s = read_all(log);
  // Two MoE layers: one warning per layer and alarm.
  EXPECT_EQ(count(s, "warning: iteration 2: layer 0: expert 3 received no tokens for 2 steps"), 1u) << s;
  EXPECT_EQ(count(s, "warning: iteration 2: layer 1: expert 3 received no tokens for 2 steps"), 1u) << s;
  EXPECT_EQ(count(s, "received no tokens"), 2u) << s;
  EXPECT_EQ(count(s, "warning: iteration 2: layer 0: max/mean expert load 2.00 (the busiest: expert 0)"), 1u) << s;
  EXPECT_EQ(count(s, "router entropy"), 2u) << s;
  EXPECT_EQ(count(s, "warning: iteration 3: layer 0: the mean per-token router entropy"), 1u) << s;
  EXPECT_EQ(count(s, "warning: iteration 2: layer 0: its aux_loss"), 1u) << s;
  EXPECT_EQ(count(s, "warning: iteration 3: lm loss"), 1u) << s;  // the first step is not a sample
  EXPECT_EQ(count(s, "lm loss") - count(s, "| lm loss"), 1u) << s;
  const auto a = alarms_in(jsonl);
  EXPECT_EQ(a.size(), 2u * 4u + 1u);
  for (const auto& j : a) EXPECT_EQ(j.at("action"), "warn") << j.dump();
  std::filesystem::remove(log);
  std::filesystem::remove(jsonl);
}

TEST(HealthAlarms, AStopAlarmEndsTheRunBeforeSavingThatStep) {
  const std::string dir = testing::fresh_temp_path("alarms_save"), jsonl = testing::fresh_temp_path("alarms_j");
  std::FILE* null = std::fopen("/dev/null", "w");
  std::string e;
  {
    train::Trainer t(steered({"--save", dir, "--save-interval", "1", "--metrics-file", jsonl, "--moe-dead-expert-steps",
                              "2", "--health-alarm-stop", "dead-expert"}),
                     null, false);
    steer(t);
    e = testing::user_error_of([&] { t.run(); });
  }
  std::fclose(null);
  EXPECT_NE(e.find("health alarm dead-expert (--health-alarm-stop): iteration 2: layer 0: expert 3 received no "
                   "tokens for 2 steps in a row (over all ranks"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("Every rank stopped after iteration 2; that step is not saved (the last checkpoint is iteration "
                   "1)"),
            std::string::npos)
      << e;
  EXPECT_EQ(read_all(dir + "/latest_checkpointed_iteration.txt").substr(0, 1), "1");
  const auto a = alarms_in(jsonl);
  ASSERT_EQ(a.size(), 2u);  // both MoE layers
  EXPECT_EQ(a[0].at("action"), "stop");
  EXPECT_EQ(a[0].at("iteration"), 2);
  std::filesystem::remove_all(dir);
  std::filesystem::remove(jsonl);
}

TEST(HealthAlarms, NonFiniteStepStopsWithAnAlarmRecordOrIsAppliedWithoutTheCheck) {
  const std::string jsonl = testing::fresh_temp_path("alarms_nan");
  std::FILE* null = std::fopen("/dev/null", "w");
  {
    train::Trainer t(quiet({"--init-method-std", "1e30", "--metrics-file", jsonl}), null, false);
    const std::string e = testing::user_error_of([&] { t.run(); });
    EXPECT_NE(e.find("iteration 1: the loss is not finite"), std::string::npos) << e;
  }
  auto a = alarms_in(jsonl);
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].at("alarm"), "nan");
  EXPECT_EQ(a[0].at("action"), "stop");
  std::filesystem::remove(jsonl);
  // Megatron's --no-check-for-nan-in-loss-and-grad: the steps are applied and the run goes on; warned once.
  const std::string log = testing::fresh_temp_path("alarms_nan_log");
  std::FILE* out = std::fopen(log.c_str(), "w");
  {
    train::Trainer t(quiet({"--init-method-std", "1e30", "--no-check-for-nan-in-loss-and-grad"}), out, false);
    EXPECT_EQ(testing::error_of([&] { t.run(); }), "");
    EXPECT_EQ(t.iteration(), 4);
  }
  std::fclose(out);
  std::fclose(null);
  const std::string s = read_all(log);
  EXPECT_EQ(count(s, "is not finite and the step was applied (--no-check-for-nan-in-loss-and-grad"), 1u) << s;
  std::filesystem::remove(log);
}

TEST(HealthAlarms, FlagsAreCheckedBeforeAnyWork) {
  const auto base = testing::tiny_moe_flags() + testing::mock_run_flags(16, 2, 2, 64, 4, "1e-3");
  EXPECT_NE(testing::user_error_of([&] {
              testing::small_config(base, {"--check-for-spiky-loss", "--loss-spike-factor", "0"});
            }).find("--check-for-spiky-loss asks for the loss-spike check"),
            std::string::npos);
  EXPECT_NE(testing::user_error_of([&] {
              testing::small_config(base, {"--health-alarm-stop", "loss-spike,dead-experts"});
            }).find("dead-experts"),
            std::string::npos);
  EXPECT_NE(testing::user_error_of([&] {
              testing::small_config(base, {"--moe-router-entropy-collapse-fraction", "1.5"});
            }).find("--moe-router-entropy-collapse-fraction"),
            std::string::npos);
  const auto c = testing::small_config(base, {"--check-for-spiky-loss", "--no-check-for-nan-in-loss-and-grad"});
  EXPECT_TRUE(c.check_for_spiky_loss);
  EXPECT_TRUE(c.no_check_for_nan_in_loss_and_grad);
  EXPECT_EQ(c.moe_dead_expert_steps, 100);  // the defaults: every alarm on, warning
  EXPECT_EQ(c.loss_spike_factor, 10.0);
  EXPECT_TRUE(c.health_alarm_stop.empty());
}

}  // namespace
}  // namespace moecore
