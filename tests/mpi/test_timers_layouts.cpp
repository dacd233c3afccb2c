// Megatron's timers over ranks (train/timers.h): min and max over the ranks that ran a timer, every rank's value
// with --timing-log-option all, and an expert-parallel run at --timing-log-level 2 timing its all-to-alls and the
// distributed optimizer's parameter all-gather on every rank.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "config_util.h"
#include "moecore/comm/process_group.h"
#include "moecore/core/file.h"
#include "moecore/train/observe/timer_log.h"
#include "moecore/train/trainer.h"
#include "test_util.h"

namespace moecore {
namespace {

using testing::operator+;

TEST(TimersOverRanks, MinMaxOverTheRanksThatRanEach) {
  const comm::ProcessGroup w = comm::ProcessGroup::world();
  const int64_t n = w.size(), me = w.rank();
  Timers t(1);
  t.set_elapsed("t", 1, 0.001 * static_cast<double>(me + 1));  // rank r: r + 1 ms
  if (me == n - 1) t.set_elapsed("only-last", 1, 0.004);
  const auto rows = train::gather_timers(t, {"t", "never-run", "only-last"}, &w, 1.0);
  ASSERT_EQ(rows.size(), 2u);  // the same rows on every rank
  EXPECT_NEAR(rows[0].min_ms, 1.0, 1e-9);
  EXPECT_NEAR(rows[0].max_ms, static_cast<double>(n), 1e-9);
  ASSERT_EQ(rows[0].rank_ms.size(), static_cast<size_t>(n));
  for (int64_t r = 0; r < n; r++) EXPECT_NEAR(rows[0].rank_ms[static_cast<size_t>(r)], r + 1.0, 1e-9);
  EXPECT_EQ(rows[1].name, "only-last");  // the ranks that never ran it do not pull its min to 0
  EXPECT_NEAR(rows[1].min_ms, 4.0, 1e-9);
  EXPECT_NEAR(rows[1].max_ms, 4.0, 1e-9);
  const std::string all = train::format_timers(rows, "all");
  EXPECT_NE(all.find("  t:\n     rank  0: 1.00\n     rank  1: 2.00"), std::string::npos) << all;
  EXPECT_NE(all.find(fmt::format("  only-last:\n     rank {:2d}: 4.00", n - 1)), std::string::npos) << all;
  EXPECT_NE(train::format_timers(rows, "minmax").find(fmt::format(": (1.00, {:.2f})", static_cast<double>(n))),
            std::string::npos);
}

TEST(TimersOverRanks, ExpertParallelRunTimesItsAllToAllsOnEveryRank) {
  const comm::ProcessGroup w = comm::ProcessGroup::world();
  const std::string base = testing::fresh_temp_path("timers_ep"), metrics = base + ".jsonl";
  const train::TrainConfig c = testing::small_config(
      testing::tiny_moe_flags() + testing::mock_run_flags(16, 2, 8, 64, 2, "1e-3"),
      {"--expert-model-parallel-size", std::to_string(w.size()), "--use-distributed-optimizer", "--log-interval", "1",
       "--eval-iters", "0", "--metrics-file", metrics, "--timing-log-level", "2", "--timing-log-option", "all"});
  std::FILE* out = std::fopen((base + ".log").c_str(), "w");
  {
    train::Trainer t(c, out, false, &w);
    t.run();
  }
  std::fclose(out);
  if (w.rank() != 0) return;  // rank 0 logs
  const std::string console = read_file(base + ".log", "the log");
  EXPECT_NE(console.find("times across ranks (ms):\n  forward-backward:\n     rank  0: "), std::string::npos)
      << console;
  std::ifstream in(metrics);
  int records = 0;
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (!j.contains("timers")) continue;
    records++;
    for (const char* name : {"forward-backward", "optimizer", "params-all-gather", "moe-dispatch-all-to-all",
                             "moe-combine-all-to-all", "moe-expert-compute", "forward-compute"}) {
      ASSERT_TRUE(j["timers"].contains(name)) << name << " in " << j.dump();
      const auto& ranks = j["timers"][name].at("rank_ms");
      ASSERT_EQ(ranks.size(), static_cast<size_t>(w.size())) << name;
      for (const auto& v : ranks) EXPECT_GT(v.get<double>(), 0.0) << name << " on every rank";
      EXPECT_LE(j["timers"][name].at("min_ms").get<double>(), j["timers"][name].at("max_ms").get<double>());
    }
  }
  EXPECT_EQ(records, 2);
}

}  // namespace
}  // namespace moecore
