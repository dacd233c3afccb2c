// Learning-rate and weight-decay schedule (see lr_schedule.h), following Megatron's OptimizerParamScheduler
// (get_lr, get_wd) formula for formula.
#include "moecore/optim/lr_schedule.h"

#include <algorithm>
#include <cmath>

#include "moecore/core/error.h"

namespace moecore::optim {

void validate(const LRSchedule& s) {
  MOE_CHECK(s.max_lr >= 0 && s.min_lr >= 0 && s.min_lr <= s.max_lr, "--min-lr {} must be in [0, --lr {}]", s.min_lr,
            s.max_lr);
  MOE_CHECK(s.init_lr >= 0 && s.init_lr <= s.max_lr, "--lr-warmup-init {} must be in [0, --lr {}]", s.init_lr,
            s.max_lr);
  MOE_CHECK(s.warmup_iters >= 0, "the warmup (--lr-warmup-iters/-samples/-fraction) must be >= 0, got {}",
            s.warmup_iters);
  MOE_CHECK(s.style == "constant" || s.style == "linear" || s.style == "cosine" || s.style == "inverse-square-root" ||
                s.style == "WSD",
            "--lr-decay-style {} is not supported; choose constant, linear, cosine, inverse-square-root or WSD",
            s.style);
  MOE_CHECK(s.style == "constant" || s.warmup_iters < static_cast<double>(s.decay_iters),
            "the warmup ({} steps) must be shorter than the decay ({} steps): lower --lr-warmup-iters, "
            "--lr-warmup-samples or --lr-warmup-fraction, or raise --lr-decay-iters/--lr-decay-samples",
            s.warmup_iters, s.decay_iters);
  if (s.style == "WSD") {
    MOE_CHECK(s.wsd_style == "linear" || s.wsd_style == "cosine" || s.wsd_style == "exponential" ||
                  s.wsd_style == "minus_sqrt",
              "--lr-wsd-decay-style {} is not supported; choose linear, cosine, exponential or minus_sqrt",
              s.wsd_style);
    MOE_CHECK(s.wsd_decay_iters > 0,
              "--lr-decay-style WSD needs the anneal length: --lr-wsd-decay-iters (or --lr-wsd-decay-samples with "
              "--train-samples) > 0");
  }
  MOE_CHECK(s.wd_incr_style == "constant" || s.wd_incr_style == "linear" || s.wd_incr_style == "cosine",
            "--weight-decay-incr-style {} is not supported; choose constant, linear or cosine", s.wd_incr_style);
  MOE_CHECK(s.start_wd >= 0 && s.end_wd >= s.start_wd,
            "--start-weight-decay {} must be >= 0 and at most --end-weight-decay {}", s.start_wd, s.end_wd);
  MOE_CHECK(s.wd_incr_style == "constant" || s.wd_incr_steps > 0,
            "--weight-decay-incr-style {} needs a positive training length (--train-iters or --train-samples)",
            s.wd_incr_style);
  MOE_CHECK(s.wd_incr_style != "constant" || s.start_wd == s.end_wd,
            "a constant weight decay needs --start-weight-decay == --end-weight-decay ({} vs {})", s.start_wd,
            s.end_wd);
}

double LRSchedule::lr(int64_t step) const {
  const double n = static_cast<double>(step);
  if (warmup_iters > 0 && n <= warmup_iters) return init_lr + (max_lr - init_lr) * n / warmup_iters;
  if (style == "constant") return max_lr;
  if (step > decay_iters) return min_lr;
  if (style == "inverse-square-root") {
    const double w = std::max(warmup_iters, 1.0);
    const double s = std::max(n, 1.0);
    return std::max(min_lr, max_lr * std::sqrt(w) / std::sqrt(s));
  }
  const double delta = max_lr - min_lr;
  if (style == "WSD") {
    const int64_t anneal_start = decay_iters - wsd_decay_iters;
    if (step <= anneal_start) return min_lr + delta;
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
  const double r = (n - warmup_iters) / (static_cast<double>(decay_iters) - warmup_iters);
  const double coeff = style == "linear" ? 1.0 - r : 0.5 * (std::cos(M_PI * r) + 1.0);
  return min_lr + coeff * delta;
}

double LRSchedule::wd(int64_t step) const {
  if (step > wd_incr_steps) return end_wd;
  if (wd_incr_style == "constant") return end_wd;
  const double r = static_cast<double>(step) / static_cast<double>(wd_incr_steps);
  const double coeff = wd_incr_style == "linear" ? r : 0.5 * (std::cos(M_PI * (1.0 - r)) + 1.0);
  return start_wd + coeff * (end_wd - start_wd);
}

}  // namespace moecore::optim
