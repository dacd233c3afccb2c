// The optimizer's settings from the training flags (--optimizer and its adam/sgd/muon flags,
// --use-distributed-optimizer): what the trainer hands optim::ChainedOptimizer.
#pragma once

#include "moecore/optim/chained_optimizer.h"
#include "moecore/train/config/config.h"

namespace moecore::train {

optim::OptimizerConfig optimizer_config(const TrainConfig& c);
// --decoupled-lr's schedule (Megatron's max_lr/min_lr override for is_embedding_or_output_parameter): the run's
// schedule `s` (the flags', or the checkpoint's) with --decoupled-lr as its peak and --decoupled-min-lr (if given)
// as its floor.
optim::LRSchedule decoupled_lr_schedule(const TrainConfig& c, optim::LRSchedule s);

}  // namespace moecore::train
