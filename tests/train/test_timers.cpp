// Megatron's timers (core/timers.h, train/timers.h): levels gate which timers exist (a level-1 run has the step
// phases and none of the level-2 operations), nested starts count once, the text of each --timing-log-option, the
// metrics file's timer records (apart from the loss records, read back by `moecore report`), forward-backward
// covering its parts, the level-0 timers Megatron always logs, and the TensorBoard "<name>-time" scalars.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "config_util.h"
#include "moecore/core/file.h"
#include "moecore/core/timer.h"
#include "moecore/report/run_history.h"
#include "moecore/train/observe/tensorboard/event.pb.h"
#include "moecore/train/observe/timer_log.h"
#include "moecore/train/trainer.h"
#include "test_util.h"

namespace moecore {
namespace {

using testing::operator+;
using json = nlohmann::json;

void sleep_ms(int ms) {
  std::this_thread::sleep_for(std::chrono::milliseconds(ms));
}

TEST(Timers, LevelAboveTheLogLevelKeepsNothing) {
  Timers t(1);
  t.start("phase", 1);
  t.stop("phase");
  t.start("operation", 2);  // level 2 in a level-1 run: no timer at all
  t.stop("operation");
  EXPECT_TRUE(t.has("phase"));
  EXPECT_FALSE(t.has("operation"));
  EXPECT_GE(t.elapsed("phase"), 0.0);
  EXPECT_EQ(t.elapsed("operation"), 0.0);
  EXPECT_EQ(t.names(), std::vector<std::string>{"phase"});
  // TimerScope reports to the installed timers only, and only at enabled levels.
  { TimerScope s("outside", 0); }
  EXPECT_FALSE(t.has("outside"));
  {
    Timers::Install in(&t);
    EXPECT_EQ(Timers::current(), &t);
    TimerScope a("inside", 1), b("too-fine", 2);
  }
  EXPECT_EQ(Timers::current(), nullptr);
  EXPECT_TRUE(t.has("inside"));
  EXPECT_FALSE(t.has("too-fine"));
}

TEST(Timers, NestedStartsCountTheOuterSpanOnceAndResetStartsAgain) {
  Timers t(2);
  const double t0 = now_seconds();
  t.start("n", 2);
  t.start("n", 2);  // a recomputed forward inside a backward
  sleep_ms(30);
  t.stop("n");
  t.stop("n");
  const double wall = now_seconds() - t0;
  const double e = t.elapsed("n", /*reset=*/true);
  EXPECT_GE(e, 0.025);
  EXPECT_LE(e, wall);  // counted twice it would be about twice the wall time
  EXPECT_EQ(t.elapsed("n"), 0.0);
  t.set_elapsed("given", 0, 1.5);
  EXPECT_EQ(t.elapsed("given"), 1.5);
}

TEST(TimersText, MegatronsFormatForEachOption) {
  const std::vector<train::TimerRow> rows = {{"forward-backward", 1.5, 2.25, {1.5, 2.25}},
                                             {"optimizer", 3.0, 3.0, {0.0, 3.0}}};
  const auto dots = [](const std::string& name) { return name + " " + std::string(47 - name.size(), '.'); };
  EXPECT_EQ(train::format_timers(rows, "minmax"), "(min, max) time across ranks (ms):\n    " +
                                                      dots("forward-backward") + ": (1.50, 2.25)\n    " +
                                                      dots("optimizer") + ": (3.00, 3.00)");
  EXPECT_EQ(train::format_timers(rows, "max"), "max time across ranks (ms):\n    " + dots("forward-backward") +
                                                   ": 2.25\n    " + dots("optimizer") + ": 3.00");
  EXPECT_EQ(train::format_timers(rows, "all"),
            "times across ranks (ms):\n  forward-backward:\n     rank  0: 1.50\n     rank  1: 2.25\n  optimizer:\n"
            "     rank  1: 3.00");
  EXPECT_EQ(train::format_timers({}, "minmax"), "");
  const json r = train::timers_record(rows, "all", 7);
  EXPECT_EQ(r.at("iteration"), 7);
  EXPECT_EQ(r.at("timers").at("optimizer").at("max_ms"), 3.0);
  EXPECT_EQ(r.at("timers").at("forward-backward").at("rank_ms"), json::parse("[1.5, 2.25]"));
  EXPECT_FALSE(train::timers_record(rows, "minmax", 7).at("timers").at("optimizer").contains("rank_ms"));
}

TEST(TimersText, GatherOnOneProcessNormalizesAndLeavesOutTimersNeverRun) {
  Timers t(2);
  t.set_elapsed("a", 1, 0.5);
  t.start("zero", 1);  // started and never stopped: counts up to now, > 0
  const auto rows = train::gather_timers(t, {"a", "never-run", "zero"}, nullptr, 2.0);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].name, "a");
  EXPECT_DOUBLE_EQ(rows[0].min_ms, 250.0);
  EXPECT_DOUBLE_EQ(rows[0].max_ms, 250.0);
  EXPECT_EQ(rows[1].name, "zero");
  EXPECT_EQ(t.elapsed("a"), 0.0);  // reset by the gather
  EXPECT_EQ(train::logged_timer_names(0), std::vector<std::string>{});
  const auto l1 = train::logged_timer_names(1), l2 = train::logged_timer_names(2);
  EXPECT_EQ(l1.front(), "forward-backward");
  EXPECT_EQ(std::count(l1.begin(), l1.end(), "forward-compute"), 0);
  EXPECT_EQ(std::count(l2.begin(), l2.end(), "forward-compute"), 1);
  EXPECT_EQ(std::count(l2.begin(), l2.end(), "moe-expert-compute"), 1);
}

TEST(TimersFlags, RangesAndChoicesAsMegatron) {
  const auto base = testing::tiny_moe_flags() + testing::mock_run_flags(16, 2, 4, 64, 2, "1e-3");
  const train::TrainConfig d = testing::small_config(base);
  EXPECT_EQ(d.timing_log_level, 0);
  EXPECT_EQ(d.timing_log_option, "minmax");
  EXPECT_FALSE(d.no_barrier_with_level_1_timing);
  const train::TrainConfig c = testing::small_config(
      base, {"--timing-log-level", "2", "--timing-log-option", "all", "--no-barrier-with-level-1-timing"});
  EXPECT_EQ(c.timing_log_level, 2);
  EXPECT_EQ(c.timing_log_option, "all");
  EXPECT_TRUE(c.no_barrier_with_level_1_timing);
  std::string err = testing::user_error_of([&] { testing::small_config(base, {"--timing-log-level", "3"}); });
  EXPECT_NE(err.find("--timing-log-level"), std::string::npos) << err;
  err = testing::user_error_of([&] { testing::small_config(base, {"--timing-log-option", "mean"}); });
  EXPECT_NE(err.find("--timing-log-option"), std::string::npos) << err;
}

struct TimedRun {
  std::string console, metrics, tensorboard;
  std::vector<json> losses, timers;  // the metrics file's loss records and timer records
};

TimedRun timed_run(const std::vector<std::string>& extra, int64_t iters = 4, int64_t log_interval = 2) {
  TimedRun r;
  const std::string base = testing::fresh_temp_path("timers_run");
  r.metrics = base + ".jsonl";
  const train::TrainConfig c =
      testing::small_config(testing::tiny_moe_flags() + testing::mock_run_flags(16, 2, 4, 64, iters, "1e-3"),
                            std::vector<std::string>{"--log-interval", std::to_string(log_interval), "--metrics-file",
                                                     r.metrics, "--eval-iters", "0"} +
                                extra);
  {
    std::FILE* out = std::fopen((base + ".log").c_str(), "w");
    {
      train::Trainer t(c, out, false);
      t.run();
    }
    std::fclose(out);
  }
  r.console = read_file(base + ".log", "the training log");
  std::ifstream in(r.metrics);
  for (std::string line; std::getline(in, line);) {
    json j = json::parse(line);
    (j.contains("timers") ? r.timers : r.losses).push_back(std::move(j));
  }
  return r;
}

double max_ms(const json& record, const std::string& name) {
  return record.at("timers").at(name).at("max_ms").get<double>();
}

TEST(TimersRun, LevelOneShowsTheStepPhasesAndNoOperations) {
  const TimedRun r = timed_run({"--timing-log-level", "1"});
  EXPECT_NE(r.console.find("(min, max) time across ranks (ms):\n    forward-backward ....."), std::string::npos)
      << r.console;
  EXPECT_NE(r.console.find("    optimizer-inner-step ....."), std::string::npos) << r.console;
  for (const char* op : {"forward-compute", "backward-compute", "batch-generator", "moe-expert-compute"})
    EXPECT_EQ(r.console.find(op), std::string::npos) << op;
  // The setup timers Megatron always logs, after the memory plan.
  EXPECT_NE(r.console.find("    model-and-optimizer-setup ...."), std::string::npos) << r.console;
  EXPECT_NE(r.console.find("    train/valid/test-data-iterators-setup ...."), std::string::npos) << r.console;
  ASSERT_EQ(r.losses.size(), 2u);
  ASSERT_EQ(r.timers.size(), 2u);
  for (size_t i = 0; i < r.timers.size(); i++) {
    const json& t = r.timers[i];
    EXPECT_EQ(t.at("iteration"), r.losses[i].at("iteration"));  // one record per log line, after it
    EXPECT_EQ(t.at("timing_log_option"), "minmax");
    for (const char* name : {"forward-backward", "all-grads-sync", "optimizer-inner-step", "optimizer"}) {
      ASSERT_TRUE(t.at("timers").contains(name)) << name << " in " << t.dump();
      EXPECT_GE(t["timers"][name].at("min_ms").get<double>(), 0.0);
      EXPECT_EQ(t["timers"][name].at("min_ms"), t["timers"][name].at("max_ms"));  // one rank
    }
    EXPECT_FALSE(t.at("timers").contains("forward-compute")) << t.dump();
    EXPECT_GE(max_ms(t, "optimizer"), max_ms(t, "optimizer-inner-step"));
    // The loss record's seconds per iteration are the same forward-backward, measured around it.
    EXPECT_NEAR(r.losses[i].at("timers/forward-backward").get<double>() * 1000, max_ms(t, "forward-backward"),
                0.05 * max_ms(t, "forward-backward") + 0.5);
  }
  // `moecore report` keeps the timer records apart: the loss rows are the two log lines.
  const report::RunHistory h = report::read_run_history(r.metrics, "run");
  EXPECT_EQ(h.train.size(), 2u);
  EXPECT_EQ(h.timers.size(), 2u);
  EXPECT_EQ(h.train.back().at("iteration"), 4);
}

TEST(TimersRun, LevelTwoForwardBackwardCoversItsParts) {
  const TimedRun r = timed_run({"--timing-log-level", "2", "--timing-log-option", "max"}, 2, 1);
  EXPECT_NE(r.console.find("max time across ranks (ms):\n    forward-backward ....."), std::string::npos) << r.console;
  ASSERT_EQ(r.timers.size(), 2u);
  for (const json& t : r.timers) {
    for (const char* name : {"batch-generator", "forward-compute", "backward-compute", "moe-expert-compute"})
      ASSERT_TRUE(t.at("timers").contains(name)) << name << " in " << t.dump();
    EXPECT_FALSE(t.at("timers").contains("moe-dispatch-all-to-all")) << "one rank: no all-to-all";
    const double parts = max_ms(t, "batch-generator") + max_ms(t, "forward-compute") + max_ms(t, "backward-compute");
    EXPECT_GE(max_ms(t, "forward-backward") * (1 + 1e-9), parts) << t.dump();
    EXPECT_GE((max_ms(t, "forward-compute") + max_ms(t, "backward-compute")) * (1 + 1e-9),
              max_ms(t, "moe-expert-compute"))
        << t.dump();
  }
}

TEST(TimersRun, LevelZeroLogsSetupAndCheckpointsOnly) {
  const std::string save = testing::fresh_temp_path("timers_save");
  const TimedRun r = timed_run({"--save", save, "--save-interval", "2"});
  EXPECT_TRUE(r.timers.empty());
  EXPECT_EQ(r.losses.size(), 2u);
  EXPECT_EQ(r.console.find("forward-backward ...."), std::string::npos) << r.console;
  EXPECT_NE(r.console.find("(min, max) time across ranks (ms):\n    save-checkpoint ....."), std::string::npos)
      << r.console;
  // Resuming logs the load the same way.
  const TimedRun resumed = timed_run({"--load", save, "--use-checkpoint-opt_param-scheduler"}, 6);
  EXPECT_NE(resumed.console.find("(min, max) time across ranks (ms):\n    load-checkpoint ....."), std::string::npos)
      << resumed.console;
  std::filesystem::remove_all(save);
}

// The scalars of the event files in `dir`: tag -> step -> value.
std::map<std::string, std::map<int64_t, double>> scalars_in(const std::string& dir) {
  std::map<std::string, std::map<int64_t, double>> s;
  for (const auto& f : std::filesystem::directory_iterator(dir)) {
    const std::string d = read_file(f.path().string(), "event file");
    for (size_t pos = 0; pos + 16 <= d.size();) {  // TFRecord: length, its CRC, data, its CRC (test_tensorboard)
      uint64_t n = 0;
      for (int i = 7; i >= 0; i--) n = (n << 8) | static_cast<unsigned char>(d[pos + static_cast<size_t>(i)]);
      tensorboard::Event e;
      EXPECT_TRUE(e.ParseFromString(d.substr(pos + 12, n)));
      for (const auto& v : e.summary().value())
        if (v.has_simple_value()) s[v.tag()][e.step()] = v.simple_value();
      pos += 16 + n;
    }
  }
  return s;
}

TEST(TimersRun, TensorBoardGetsTheLoggedTimersAsNameTime) {
  const std::string tb = testing::fresh_temp_path("timers_tb");
  const TimedRun r = timed_run({"--timing-log-level", "1", "--tensorboard-dir", tb, "--log-timers-to-tensorboard"});
  const auto s = scalars_in(tb);
  ASSERT_EQ(r.timers.size(), 2u);
  for (const json& t : r.timers) {
    const int64_t it = t.at("iteration").get<int64_t>();
    EXPECT_GT(s.at("iteration-time").at(it), 0.0);
    for (const auto& [name, v] : t.at("timers").items()) {
      ASSERT_TRUE(s.count(name + "-time") && s.at(name + "-time").count(it)) << name << " at " << it;
      EXPECT_NEAR(s.at(name + "-time").at(it), v.at("max_ms").get<double>() / 1000,
                  1e-6 * v.at("max_ms").get<double>());
    }
  }
  // Level 0 (Megatron's default): iteration-time only.
  const std::string tb0 = testing::fresh_temp_path("timers_tb0");
  timed_run({"--tensorboard-dir", tb0, "--log-timers-to-tensorboard"});
  const auto s0 = scalars_in(tb0);
  EXPECT_TRUE(s0.count("iteration-time"));
  EXPECT_FALSE(s0.count("forward-backward-time"));
  std::filesystem::remove_all(tb);
  std::filesystem::remove_all(tb0);
}

}  // namespace
}  // namespace moecore
