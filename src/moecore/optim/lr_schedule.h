// Megatron's OptimizerParamScheduler: the learning rate (linear warmup from --lr-warmup-init, then constant,
// linear, cosine, inverse-square-root or WSD (warmup-stable-decay) decay to --min-lr at the decay step, and --min-lr
// after) and the weight decay (constant, or a linear or cosine increase from --start-weight-decay to
// --end-weight-decay). The schedule counts whatever its caller counts: the trainer counts samples, as Megatron does
// (its step advances by the global batch size), so iteration-based flags are multiplied by the global batch size
// (train/config.cpp, lr_schedule) and both forms give identical values.
#pragma once

#include <cstdint>
#include <string>

namespace moecore::optim {

struct LRSchedule {
  double init_lr = 0.0;  // --lr-warmup-init: where warmup starts
  double max_lr = 1e-4;
  double min_lr = 0.0;
  double warmup_iters = 0;                // warmup steps (fractional with --lr-warmup-fraction)
  int64_t decay_iters = 0;                // decay steps (--lr-decay-iters x batch or --lr-decay-samples)
  std::string style = "linear";           // constant | linear | cosine | inverse-square-root | WSD
  std::string wsd_style = "exponential";  // linear | cosine | exponential | minus_sqrt
  int64_t wsd_decay_iters = 0;            // WSD anneal steps
  // Weight decay: constant (start == end), or increased over wd_incr_steps.
  double start_wd = 0.0, end_wd = 0.0;
  int64_t wd_incr_steps = 0;
  std::string wd_incr_style = "constant";  // constant | linear | cosine

  // The learning rate and weight decay after `step` steps (Megatron's num_steps): the first iteration uses
  // lr(0), which is --lr-warmup-init during warmup, as in Megatron.
  double lr(int64_t step) const;
  double wd(int64_t step) const;
};

// Megatron's scheduler assertions, as errors naming the flags.
void validate(const LRSchedule& s);

}  // namespace moecore::optim
