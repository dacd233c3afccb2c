// GradScaler (see grad_scaler.h): DynamicGradScaler.update of Megatron's grad_scaler.py, step for step.
#include "moecore/optim/grad_scaler.h"

#include <algorithm>

#include "moecore/core/error.h"

namespace moecore::optim {

GradScaler::GradScaler(const GradScalerConfig& c) : cfg_(c) {
  MOE_ASSERT(cfg_.kind == GradScalerConfig::Kind::None || cfg_.initial_scale > 0.0f);
  if (cfg_.kind == GradScalerConfig::Kind::None) cfg_.initial_scale = 1.0f;
  if (dynamic()) MOE_ASSERT(cfg_.min_scale > 0.0f && cfg_.min_scale <= cfg_.initial_scale && cfg_.hysteresis > 0);
  s_.scale = cfg_.initial_scale;
  s_.hysteresis_tracker = dynamic() ? cfg_.hysteresis : 0;
}

void GradScaler::update(bool found_inf) {
  if (!dynamic()) return;  // the constant scaler never changes
  if (found_inf) {
    s_.growth_tracker = 0;
    s_.hysteresis_tracker--;
    // Out of hysteresis: back off (and again at every later non-finite step until a growth resets the tracker).
    if (s_.hysteresis_tracker <= 0) s_.scale = std::max(s_.scale * kBackoffFactor, cfg_.min_scale);
  } else {
    s_.growth_tracker++;
    if (static_cast<double>(s_.growth_tracker) == cfg_.window) {  // a float window that is no integer never grows
      s_.growth_tracker = 0;
      s_.hysteresis_tracker = cfg_.hysteresis;
      s_.scale = s_.scale * kGrowthFactor;
    }
  }
}

void GradScaler::load(const GradScalerState& s) {
  if (!active()) return;
  s_ = s;
  if (!dynamic()) s_.scale = cfg_.initial_scale;  // Megatron's ConstantGradScaler loads nothing
}

}  // namespace moecore::optim
