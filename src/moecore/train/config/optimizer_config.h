// The optimizer's settings from the training flags (--optimizer and its adam/sgd/muon flags,
// --use-distributed-optimizer): what the trainer hands optim::ChainedOptimizer.
#pragma once

#include "moecore/optim/chained_optimizer.h"
#include "moecore/train/config/config.h"

namespace moecore::train {

optim::OptimizerConfig optimizer_config(const TrainConfig& c);
// Megatron's scaler choice (optimizer/__init__.py): --loss-scale S > 0 with --fp16, --bf16 or the distributed
// optimizer a constant scale; else --fp16 the dynamic scaler; else none (fp32
// and bf16 train unscaled; --loss-scale then has no effect, as in Megatron).
optim::GradScalerConfig grad_scaler_config(const TrainConfig& c);
inline bool loss_scaling(const TrainConfig& c) {
  return grad_scaler_config(c).kind != optim::GradScalerConfig::Kind::None;
}
// Megatron's check_for_nan_in_loss_and_grad: on unless --no-check-for-nan-in-loss-and-grad, and off under dynamic
// loss scaling, whose non-finite gradients are the scaler's signal (the step is skipped, not the run stopped).
bool check_nan_in_loss_and_grad(const TrainConfig& c);
// The main gradients' dtypes (optim/low_precision_grads.h), Megatron's: the gradient buffer's dtype is fp32 with
// --accumulate-allreduce-grads-in-fp32, else the model's (fp16 under --fp16; bf16 under --bf16 only with
// --grad-reduce-in-bf16, or --main-grads-dtype bf16, which turn off the fp32 default arguments.py gives bf16);
// under Megatron FSDP --megatron-fsdp-main-grads-dtype (auto: the model's dtype) and
// --megatron-fsdp-grad-comm-dtype (auto: the main gradients').
optim::GradPrecision grad_precision(const TrainConfig& c);
// --decoupled-lr's schedule (Megatron's max_lr/min_lr override for is_embedding_or_output_parameter): the run's
// schedule `s` (the flags', or the checkpoint's) with --decoupled-lr as its peak and --decoupled-min-lr (if given)
// as its floor.
optim::LRSchedule decoupled_lr_schedule(const TrainConfig& c, optim::LRSchedule s);

}  // namespace moecore::train
