// Learning-rate schedule (see lr_schedule.h), following Megatron's OptimizerParamScheduler.get_lr.
#include "moecore/optim/lr_schedule.h"

#include <cmath>

#include "moecore/core/error.h"

namespace moecore::optim {

void validate(const LRSchedule& s) {
  MOE_CHECK(s.max_lr >= 0 && s.min_lr >= 0 && s.min_lr <= s.max_lr, "--min-lr {} must be in [0, --lr {}]", s.min_lr,
            s.max_lr);
  MOE_CHECK(s.warmup_iters >= 0, "--lr-warmup-iters must be >= 0, got {}", s.warmup_iters);
  MOE_CHECK(s.style == "constant" || s.style == "linear" || s.style == "cosine" || s.style == "WSD",
            "--lr-decay-style {} is not supported; choose constant, linear, cosine or WSD", s.style);
  MOE_CHECK(s.style == "constant" || s.decay_iters > s.warmup_iters,
            "--lr-decay-iters ({}) must exceed --lr-warmup-iters ({})", s.decay_iters, s.warmup_iters);
  if (s.style == "WSD") {
    MOE_CHECK(s.wsd_style == "linear" || s.wsd_style == "cosine" || s.wsd_style == "exponential" ||
                  s.wsd_style == "minus_sqrt",
              "--lr-wsd-decay-style {} is not supported; choose linear, cosine, exponential or minus_sqrt",
              s.wsd_style);
    MOE_CHECK(s.wsd_decay_iters > 0 && s.wsd_decay_iters <= s.decay_iters - s.warmup_iters,
              "--lr-wsd-decay-iters {} must be in (0, --lr-decay-iters - --lr-warmup-iters = {}]", s.wsd_decay_iters,
              s.decay_iters - s.warmup_iters);
  }
}

double LRSchedule::lr(int64_t step) const {
  if (warmup_iters > 0 && step <= warmup_iters)
    return max_lr * static_cast<double>(step) / static_cast<double>(warmup_iters);
  if (style == "constant") return max_lr;
  if (step > decay_iters) return min_lr;
  const double delta = max_lr - min_lr;
  if (style == "WSD") {
    const int64_t anneal_start = decay_iters - wsd_decay_iters;
    if (step <= anneal_start) return max_lr;
    const double r = static_cast<double>(step - anneal_start) / static_cast<double>(wsd_decay_iters);
    double coeff;
    if (wsd_style == "linear")
      coeff = 1.0 - r;
    else if (wsd_style == "cosine")
      coeff = 0.5 * (std::cos(M_PI * r) + 1.0);
    else if (wsd_style == "exponential")
      coeff = 2.0 * std::pow(0.5, r) - 1.0;
    else
      coeff = 1.0 - std::sqrt(r);  // minus_sqrt
    return min_lr + coeff * delta;
  }
  const double r = static_cast<double>(step - warmup_iters) / static_cast<double>(decay_iters - warmup_iters);
  const double coeff = style == "linear" ? 1.0 - r : 0.5 * (std::cos(M_PI * r) + 1.0);
  return min_lr + coeff * delta;
}

}  // namespace moecore::optim
