// `moecore report`'s data side: reading metrics files back (resumed runs, cut-off lines, bad lines), the charts
// planned from them, and escaping of everything from the files that lands in the page. The page in a real browser:
// tests/report/browser.sh.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include "moecore/report/report_page.h"
#include "moecore/report/run_history.h"
#include "test_util.h"

namespace moecore::report {
namespace {

using nlohmann::json;
using testing::fresh_temp_path;
using testing::user_error_of;

std::string write_run(const std::string& name, const std::string& text) {
  const std::string p = fresh_temp_path(name);
  std::ofstream(p) << text;
  return p;
}

// A log row as train/metrics.cpp writes it, with two MoE layers of 4 experts.
json row(int64_t it, double loss) {
  return {{"iteration", it},
          {"lm_loss", loss},
          {"lr", 1e-3},
          {"grad_norm", 1.0},
          {"tokens_per_sec", 1000.0},
          {"gflops_ratio_to_gemm_peak", 0.5},
          {"peak_memory_bytes", 1 << 20},
          {"load_balancing_loss", 1.01},
          {"max_over_mean_expert_load", 1.5},
          {"tokens_per_expert", {{"layer_1", {8, 0, 4, 4}}, {"layer_3", {4, 4, 4, 4}}}},
          {"router_entropy", {{"layer_1", 1.2}, {"layer_3", 1.3}}},
          {"dropped_assignments", {{"layer_1", 0}, {"layer_3", 0}}}};
}

std::string lines(const std::vector<json>& rows) {
  std::string s;
  for (const auto& r : rows) s += r.dump() + "\n";
  return s;
}

TEST(ReportHistory, ResumedRunReplacesWhatTheInterruptedRunLoggedAfterItsCheckpoint) {
  // Run 1 logged 10..40 and validated at 20 and 40, then died; the checkpoint was at 20; run 2 resumed from it.
  const json v20 = {{"eval", "valid"}, {"iteration", 20}, {"lm_loss", 5.0}};
  const json v40 = {{"eval", "valid"}, {"iteration", 40}, {"lm_loss", 4.0}};
  const std::string p =
      write_run("report_resumed.jsonl",
                lines({row(10, 6), row(20, 5.5), v20, row(30, 5.2), row(40, 5.1), v40, row(30, 5.3), row(40, 5.25)}));
  const RunHistory h = read_run_history(p, "r");
  ASSERT_EQ(h.train.size(), 4u);
  EXPECT_EQ(h.train[2]["lm_loss"], 5.3);   // the resumed run's iteration 30
  EXPECT_EQ(h.train[3]["lm_loss"], 5.25);  // and 40
  ASSERT_EQ(h.valid.size(), 1u);           // validation at 40 belonged to the interrupted run
  EXPECT_EQ(h.valid[0]["iteration"], 20);
}

TEST(ReportHistory, AlarmRecordsAreKeptApartFromTheLogLines) {
  const json alarm = {{"alarm", "dead-expert"}, {"iteration", 20}, {"action", "warn"}, {"message", "expert 3"}};
  const RunHistory h = read_run_history(write_run("report_alarm.jsonl", lines({row(10, 6), row(20, 5.5), alarm})), "r");
  ASSERT_EQ(h.train.size(), 2u);
  EXPECT_EQ(h.train[1]["lm_loss"], 5.5);
  ASSERT_EQ(h.alarms.size(), 1u);
  EXPECT_EQ(h.alarms[0]["alarm"], "dead-expert");
}

TEST(ReportHistory, ACutOffLastLineIsSkippedAndCountedButABadLineInsideIsAnError) {
  const std::string ok = lines({row(10, 6), row(20, 5)});
  const RunHistory h = read_run_history(write_run("report_cut.jsonl", ok + "{\"iteration\": 30, \"lm_l"), "r");
  EXPECT_EQ(h.train.size(), 2u);
  EXPECT_EQ(h.skipped_lines, 1);
  const std::string bad = write_run("report_bad.jsonl", ok + "{\"iteration\": 30,\n" + row(40, 4).dump() + "\n");
  EXPECT_NE(user_error_of([&] { read_run_history(bad, "r"); }).find("report_bad.jsonl line 3: not a JSON object"),
            std::string::npos);
  const std::string no_it = write_run("report_noit.jsonl", "{\"lm_loss\": 3}\n");
  EXPECT_NE(user_error_of([&] { read_run_history(no_it, "r"); }).find("line 1: no integer \"iteration\""),
            std::string::npos);
  const std::string empty = write_run("report_empty.jsonl", "\n");
  EXPECT_NE(user_error_of([&] { read_run_history(empty, "r"); }).find("no metrics lines"), std::string::npos);
}

TEST(ReportHistory, DefaultNameIsTheStemOrTheDirectoryOfMetricsJsonl) {
  EXPECT_EQ(default_run_name("runs/a/metrics.jsonl"), "a");
  EXPECT_EQ(default_run_name("runs/lr3e-4.jsonl"), "lr3e-4");
  EXPECT_EQ(default_run_name("metrics.jsonl"), "metrics");
}

RunHistory history(const std::string& name, std::vector<json> train, std::vector<json> valid = {}) {
  RunHistory h;
  h.name = name;
  h.path = name + ".jsonl";
  h.train = std::move(train);
  h.valid = std::move(valid);
  return h;
}

std::vector<std::string> titles(const json& charts) {
  std::vector<std::string> t;
  for (const auto& c : charts) t.push_back(c["title"]);
  return t;
}

TEST(ReportCharts, OneRunGetsItsCurvesAndAHeatmapPerMoELayer) {
  const json v = {{"eval", "valid"}, {"iteration", 2}, {"lm_loss", 5.0}};
  const json charts = plan_charts({history("a", {row(1, 6), row(2, 5)}, {v})});
  const std::vector<std::string> want = {"LM loss",
                                         "Learning rate",
                                         "Gradient norm (before clipping)",
                                         "Throughput",
                                         "Model FLOP utilization (of the measured GEMM peak)",
                                         "Peak memory",
                                         "MoE auxiliary and z losses",
                                         "Max / mean expert load (worst layer)",
                                         "Router entropy per layer (ln E: uniform)",
                                         "Expert load, layer 1",
                                         "Expert load, layer 3"};
  EXPECT_EQ(titles(charts), want);  // no TFLOP/s, no dropped assignments (all zero), no per-layer losses
  const json& loss = charts[0]["series"];
  ASSERT_EQ(loss.size(), 2u);
  EXPECT_EQ(loss[0]["name"], "train");
  EXPECT_EQ(loss[1]["name"], "validation");
  EXPECT_EQ(loss[1]["data"], json::parse("[[2, 5.0]]"));
  EXPECT_DOUBLE_EQ(charts[4]["series"][0]["data"][0][1].get<double>(), 50.0);  // percent
  EXPECT_DOUBLE_EQ(charts[5]["series"][0]["data"][0][1].get<double>(), 1.0);   // MiB
  EXPECT_DOUBLE_EQ(charts[8]["ref"].get<double>(), std::log(4.0));
  // Heatmap cells: [column, expert, tokens / mean, tokens]; layer 1's expert 1 got nothing, expert 0 twice the mean.
  const json& hm = charts[9];
  EXPECT_EQ(hm["experts"], 4);
  EXPECT_EQ(hm["x"], json::parse("[1, 2]"));
  ASSERT_EQ(hm["cells"].size(), 8u);
  EXPECT_EQ(hm["cells"][0], json::parse("[0, 0, 2.0, 8.0]"));
  EXPECT_EQ(hm["cells"][1], json::parse("[0, 1, 0.0, 0.0]"));
  EXPECT_EQ(hm["entropy"], json::parse("[[0, 1.2], [1, 1.2]]"));
}

TEST(ReportCharts, RunsAreOverlaidByNameAndEachGetsItsHeatmaps) {
  json b2 = row(2, 4);
  b2["moe/load_balancing_loss_layer_1"] = 1.1;
  b2["moe/load_balancing_loss_layer_3"] = 1.2;
  b2["timers/forward-backward"] = 0.5;
  b2["lm_loss"] = nullptr;  // a NaN loss: a gap in the curve, not a dropped point
  const json charts = plan_charts({history("a", {row(1, 6), row(2, 5)}), history("b", {row(1, 6), b2})});
  const auto t = titles(charts);
  EXPECT_EQ(std::count(t.begin(), t.end(), "load_balancing_loss per layer"), 1);
  EXPECT_EQ(std::count(t.begin(), t.end(), "Timers"), 1);
  EXPECT_EQ(std::count(t.begin(), t.end(), "Expert load, layer 1 · a"), 1);
  EXPECT_EQ(std::count(t.begin(), t.end(), "Expert load, layer 3 · b"), 1);
  const json& loss = charts[0]["series"];
  ASSERT_EQ(loss.size(), 2u);
  EXPECT_EQ(loss[0]["name"], "a · train");
  EXPECT_EQ(loss[1]["name"], "b · train");
  EXPECT_TRUE(loss[1]["data"][1][1].is_null());
  EXPECT_NE(loss[0]["color"], loss[1]["color"]);
}

TEST(ReportCharts, HeatmapColumnsAreCappedByTakingEveryNthRow) {
  std::vector<json> rows;
  for (int64_t i = 1; i <= static_cast<int64_t>(3 * kMaxHeatmapColumns); i++) rows.push_back(row(i, 5));
  const json charts = plan_charts({history("a", rows)});
  const json& hm = charts[charts.size() - 1];
  EXPECT_EQ(hm["x"].size(), kMaxHeatmapColumns);
  EXPECT_EQ(hm["x"][1], 4);
}

TEST(ReportPage, NamesAndPathsFromTheFilesAreEscapedWhereverTheyLand) {
  EXPECT_EQ(html_escape("a<b>&\"c'"), "a&lt;b&gt;&amp;&quot;c&#39;");
  const json j = {{"name", "</script><script>alert(1)</script>&"}};
  const std::string s = json_for_script(j);
  EXPECT_EQ(s.find('<'), std::string::npos);
  EXPECT_EQ(s.find('>'), std::string::npos);
  EXPECT_EQ(json::parse(s), j);  // the same JSON to JSON.parse
  const std::string evil = "<img src=x onerror=alert(1)>";
  RunHistory h = history(evil, {row(1, 6)});
  h.path = "dir/\"quoted\"/" + evil + ".jsonl";
  const std::string page = render_report_html({h}, "/* chart library */", "moecore test");
  EXPECT_EQ(page.find(evil), std::string::npos);
  EXPECT_NE(page.find("&lt;img src=x onerror=alert(1)&gt;"), std::string::npos);
  EXPECT_NE(page.find("data-expected-charts=\"11\""), std::string::npos);
  // Exactly the page's own <script> elements: the error counter, the library, the data, the drawing script.
  size_t scripts = 0;
  for (size_t p = page.find("<script"); p != std::string::npos; p = page.find("<script", p + 1)) scripts++;
  EXPECT_EQ(scripts, 4u);
}

}  // namespace
}  // namespace moecore::report
