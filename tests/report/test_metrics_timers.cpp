// The metrics file's timers (what `moecore report` draws as "Timers"): Megatron's forward-backward and optimizer
// timers, mean seconds per iteration since the previous line.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "config_util.h"
#include "moecore/core/timer.h"
#include "moecore/train/trainer.h"
#include "test_util.h"

namespace moecore {
namespace {

using testing::operator+;

TEST(MetricsTimers, ForwardBackwardAndOptimizerSecondsPerIterationInEachLine) {
  const std::string out_path = testing::fresh_temp_path("timers_out"), metrics = out_path + ".jsonl";
  const train::TrainConfig c =
      testing::small_config(testing::tiny_moe_flags() + testing::mock_run_flags(16, 2, 4, 64, 4, "1e-3"),
                            std::vector<std::string>{"--log-interval", "2", "--metrics-file", metrics});
  std::FILE* out = std::fopen(out_path.c_str(), "w");
  const double t0 = now_seconds();
  {
    train::Trainer t(c, out, false);
    t.run();
  }
  const double wall = now_seconds() - t0;
  std::fclose(out);
  std::ifstream in(metrics);
  int lines = 0;
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains("eval")) continue;
    lines++;
    const double fb = j.at("timers/forward-backward").get<double>(), opt = j.at("timers/optimizer").get<double>();
    EXPECT_GT(fb, 0);
    EXPECT_GT(opt, 0);
    EXPECT_LT(2 * (fb + opt), wall);  // per iteration, two iterations a line
  }
  EXPECT_EQ(lines, 2);
}

}  // namespace
}  // namespace moecore
