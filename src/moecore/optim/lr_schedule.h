// Megatron's OptimizerParamScheduler for the learning rate: linear warmup from 0, then constant, linear, cosine
// or WSD (warmup-stable-decay) decay to --min-lr at --lr-decay-iters, and --min-lr after. Counted in iterations
// (Megatron counts samples, which is the same schedule scaled by the global batch size).
#pragma once

#include <cstdint>
#include <string>

namespace moecore::optim {

struct LRSchedule {
  double max_lr = 1e-4;
  double min_lr = 0.0;
  int64_t warmup_iters = 0;
  int64_t decay_iters = 0;                // --lr-decay-iters (defaults to --train-iters)
  std::string style = "linear";           // constant | linear | cosine | WSD
  std::string wsd_style = "exponential";  // linear | cosine | exponential | minus_sqrt
  int64_t wsd_decay_iters = 0;

  // The learning rate after `step` completed optimizer steps (Megatron's num_steps): the first iteration uses
  // lr(0), which is 0 during warmup, as in Megatron.
  double lr(int64_t step) const;
};

void validate(const LRSchedule& s);

}  // namespace moecore::optim
