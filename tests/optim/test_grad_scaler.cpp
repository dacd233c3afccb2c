// Megatron's loss scalers (optim/grad_scaler.h) on planted runs of non-finite steps, each scale computed by hand
// from DynamicGradScaler.update: the growth tracker reset by every overflow, the hysteresis tracker only by a growth,
// the scale halved once `hysteresis` overflows have been counted (and at each one after), doubled after `window`
// clean steps, never below the minimum; the constant scaler never moves; the state round-trips.
#include <gtest/gtest.h>

#include <vector>

#include "moecore/optim/grad_scaler.h"

namespace moecore {
namespace {

using optim::GradScaler;
using optim::GradScalerConfig;

GradScaler dynamic(float initial, float min, double window, int64_t hysteresis) {
  GradScalerConfig c;
  c.kind = GradScalerConfig::Kind::Dynamic;
  c.initial_scale = initial;
  c.min_scale = min;
  c.window = window;
  c.hysteresis = hysteresis;
  return GradScaler(c);
}

TEST(GradScaler, DynamicScaleSequenceFollowsMegatron) {
  GradScaler s = dynamic(1024.0f, 64.0f, 3, 2);
  EXPECT_TRUE(s.dynamic());
  EXPECT_EQ(s.inv_scale(), 1.0f / 1024.0f);
  // Each step: found_inf, then the scale, growth tracker and hysteresis tracker after update, by hand.
  struct Want {
    bool inf;
    float scale;
    int64_t growth, hyst;
  };
  const std::vector<Want> run = {
      {true, 1024, 0, 1},   // first overflow: hysteresis 2 -> 1, scale kept
      {false, 1024, 1, 1},  // a clean step does not restore hysteresis
      {true, 512, 0, 0},    // second overflow (not consecutive!): tracker 0, halved
      {true, 256, 0, -1},   // every overflow after that halves again
      {true, 128, 0, -2},  {true, 64, 0, -3},  {true, 64, 0, -4},  // never below the minimum
      {false, 64, 1, -4},                                          // clean steps count up
      {false, 64, 2, -4},  {false, 128, 0, 2},                     // window 3: doubled, both trackers reset
      {false, 128, 1, 2},  {true, 128, 0, 1},                      // an overflow resets the growth count
      {false, 128, 1, 1},  {false, 128, 2, 1}, {false, 256, 0, 2},
  };
  for (size_t i = 0; i < run.size(); i++) {
    s.update(run[i].inf);
    const auto st = s.state();
    EXPECT_EQ(st.scale, run[i].scale) << "step " << i;
    EXPECT_EQ(st.growth_tracker, run[i].growth) << "step " << i;
    EXPECT_EQ(st.hysteresis_tracker, run[i].hyst) << "step " << i;
  }
}

TEST(GradScaler, DefaultsStartAt2To32AndBackOffPerOverflowWithHysteresisOne) {
  GradScaler s = dynamic(4294967296.0f, 1.0f, 1000, 1);
  for (int i = 0; i < 5; i++) s.update(true);
  EXPECT_EQ(s.scale(), 134217728.0f);  // 2^32 / 2^5
  EXPECT_EQ(s.inv_scale(), 0x1p-27f);
  for (int i = 0; i < 999; i++) s.update(false);
  EXPECT_EQ(s.scale(), 134217728.0f);
  s.update(false);
  EXPECT_EQ(s.scale(), 268435456.0f);
}

TEST(GradScaler, AWindowThatIsNoIntegerNeverGrows) {  // Megatron's float --loss-scale-window compared with ==
  GradScaler s = dynamic(8.0f, 1.0f, 2.5, 2);
  for (int i = 0; i < 10; i++) s.update(false);
  EXPECT_EQ(s.scale(), 8.0f);
}

TEST(GradScaler, ConstantNeverMovesAndNoneIsOne) {
  GradScalerConfig c;
  c.kind = GradScalerConfig::Kind::Constant;
  c.initial_scale = 1000.0f;
  GradScaler s(c);
  for (int i = 0; i < 5; i++) s.update(true);
  EXPECT_EQ(s.scale(), 1000.0f);
  EXPECT_EQ(s.inv_scale(), static_cast<float>(1.0 / 1000.0));  // f32(1 / f64(scale)), as Megatron
  s.load({7.0f, 3, 4});
  EXPECT_EQ(s.scale(), 1000.0f);  // ConstantGradScaler loads nothing
  GradScaler none;
  EXPECT_FALSE(none.active());
  EXPECT_EQ(none.scale(), 1.0f);
}

TEST(GradScaler, StateRoundTrips) {
  GradScaler a = dynamic(256.0f, 1.0f, 4, 3);
  for (bool inf : {true, false, true, true, false}) a.update(inf);
  GradScaler b = dynamic(256.0f, 1.0f, 4, 3);
  b.load(a.state());
  for (bool inf : {false, false, false, true, false, false, false, false}) {
    a.update(inf);
    b.update(inf);
    EXPECT_EQ(a.state().scale, b.state().scale);
    EXPECT_EQ(a.state().growth_tracker, b.state().growth_tracker);
    EXPECT_EQ(a.state().hysteresis_tracker, b.state().hysteresis_tracker);
  }
}

}  // namespace
}  // namespace moecore
