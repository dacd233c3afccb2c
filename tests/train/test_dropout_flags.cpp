// --hidden-dropout and --attention-dropout: Megatron's defaults (0.1), the accepted range [0, 1), 0 in the presets,
// and the values reaching the model's configuration.
#include <gtest/gtest.h>

#include "config_util.h"
#include "moecore/train/config/config.h"
#include "moecore/train/config/presets.h"
#include "test_util.h"

namespace moecore {
namespace {

using testing::operator+;

const std::vector<std::string> kDropoutRun = {"--mock-data", "--vocab-size", "64", "--train-iters", "100"};

TEST(DropoutFlags, DefaultsRangeAndPresets) {
  const train::TrainConfig c = testing::small_config(kDropoutRun);
  EXPECT_EQ(c.hidden_dropout, 0.1);
  EXPECT_EQ(c.attention_dropout, 0.1);
  const nn::GPTConfig g = train::gpt_config(
      testing::small_config(kDropoutRun, {"--hidden-dropout", "0.2", "--attention-dropout", "0.3"}), 64);
  EXPECT_EQ(g.hidden_dropout, 0.2);
  EXPECT_EQ(g.attention_dropout, 0.3);
  EXPECT_EQ(g.seed, 1234u);
  for (const char* flag : {"--hidden-dropout", "--attention-dropout"})
    for (const char* bad : {"1", "-0.1", "1.5"}) {
      const std::string e = testing::user_error_of([&] { testing::small_config(kDropoutRun, {flag, bad}); });
      EXPECT_NE(e.find(flag), std::string::npos) << e;
      EXPECT_NE(e.find("[0, 1)"), std::string::npos) << e;
    }
  for (const std::string& m : train::preset_names()) {
    const train::TrainConfig p = testing::small_config(kDropoutRun + std::vector<std::string>{"--model", m});
    EXPECT_EQ(p.hidden_dropout, 0.0) << m;
    EXPECT_EQ(p.attention_dropout, 0.0) << m;
  }
}

}  // namespace
}  // namespace moecore
