// Megatron's loss scaling (megatron/core/optimizer/grad_scaler.py): the factor the loss is multiplied by before
// backward, so that small gradients survive low-precision arithmetic, and its update after each step. A constant
// scaler (--loss-scale S) never changes; the dynamic one (--fp16 without --loss-scale) halves the scale after
// `hysteresis` steps with a non-finite gradient (each one after that halves it again, until a growth resets the
// count) and doubles it after `window` consecutive clean steps, never below `min_scale`. Gradients are unscaled by
// inv_scale() (f32(1 / f64(scale)), as Megatron computes it) before the norm, the clipping and the update; a step
// whose unscaled gradients hold an inf or NaN anywhere is skipped (optim/chained_optimizer.h). No scaler (bf16 or
// fp32 without --loss-scale): scale 1.
#pragma once

#include <cstdint>

namespace moecore::optim {

struct GradScalerConfig {
  enum class Kind { None, Constant, Dynamic };
  Kind kind = Kind::None;
  float initial_scale = 1.0f;  // --loss-scale, or --initial-loss-scale (2^32) for the dynamic scaler
  float min_scale = 1.0f;      // --min-loss-scale
  double window = 1000;        // --loss-scale-window: clean steps before the scale grows (Megatron's float)
  int64_t hysteresis = 2;      // --hysteresis: non-finite steps before it backs off
};

// What a checkpoint keeps of a scaler (Megatron's state_dict: scale, growth_tracker, hysteresis_tracker).
struct GradScalerState {
  float scale = 1.0f;
  int64_t growth_tracker = 0, hysteresis_tracker = 0;
};

class GradScaler {
 public:
  static constexpr float kGrowthFactor = 2.0f, kBackoffFactor = 0.5f;  // Megatron's, fixed
  GradScaler() = default;
  explicit GradScaler(const GradScalerConfig& c);
  bool active() const { return cfg_.kind != GradScalerConfig::Kind::None; }
  bool dynamic() const { return cfg_.kind == GradScalerConfig::Kind::Dynamic; }
  float scale() const { return s_.scale; }
  float inv_scale() const { return static_cast<float>(1.0 / static_cast<double>(s_.scale)); }
  // After a step's unscaled gradients were checked (found_inf: an inf or NaN on any rank): Megatron's update.
  void update(bool found_inf);
  GradScalerState state() const { return s_; }
  void load(const GradScalerState& s);

 private:
  GradScalerConfig cfg_;
  GradScalerState s_;
};

}  // namespace moecore::optim
