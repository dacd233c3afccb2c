// validate()'s optimizer checks (see config_validate.h): the batch, Adam's state dtypes with the precision-aware
// optimizer, Muon, sample- or iteration-based training and the learning-rate and weight-decay schedules (the
// schedule's own checks: optim/lr_schedule.h). Not the optimizer's construction (optimizer_config.cpp).
#include <utility>

#include "moecore/core/error.h"
#include "moecore/optim/newton_schulz.h"
#include "moecore/train/config/config_validate.h"
#include "moecore/train/config/optimizer_config.h"

namespace moecore::train {

namespace {

bool was_derived(const TrainConfig& c, const std::string& flag) {
  for (const auto& [name, value] : c.derived)
    if (name == flag) return true;
  return false;
}

// Megatron's checks on sample- vs iteration-based training, the warmup forms, the weight-decay schedule and the
// scheduler's resume flags.
void validate_schedule_flags(const TrainConfig& c) {
  if (c.train_samples > 0 && !c.skip_train) {
    MOE_CHECK(was_derived(c, "train-iters"),
              "--train-iters {} and --train-samples {} are exclusive: give one (iterations follow from samples / "
              "--global-batch-size)",
              c.train_iters, c.train_samples);
    MOE_CHECK(c.lr_decay_iters == 0, "--lr-decay-iters {} with --train-samples: use --lr-decay-samples",
              c.lr_decay_iters);
    MOE_CHECK(c.lr_warmup_iters == 0, "--lr-warmup-iters {} with --train-samples: use --lr-warmup-samples",
              c.lr_warmup_iters);
    MOE_CHECK(c.lr_wsd_decay_iters == 0, "--lr-wsd-decay-iters {} with --train-samples: use --lr-wsd-decay-samples",
              c.lr_wsd_decay_iters);
    MOE_CHECK(c.lr_warmup_fraction < 0 || c.lr_warmup_samples == 0,
              "--lr-warmup-fraction {} and --lr-warmup-samples {} are exclusive: give one", c.lr_warmup_fraction,
              c.lr_warmup_samples);
    MOE_CHECK(c.train_samples >= c.global_batch_size,
              "--train-samples {} is less than one global batch (--global-batch-size {}): no iteration to train",
              c.train_samples, c.global_batch_size);
  } else if (!c.skip_train) {
    MOE_CHECK(c.lr_decay_samples == 0,
              "--lr-decay-samples {} needs --train-samples (with --train-iters use "
              "--lr-decay-iters)",
              c.lr_decay_samples);
    MOE_CHECK(c.lr_warmup_samples == 0,
              "--lr-warmup-samples {} needs --train-samples (with --train-iters use "
              "--lr-warmup-iters)",
              c.lr_warmup_samples);
    MOE_CHECK(c.lr_wsd_decay_samples == 0,
              "--lr-wsd-decay-samples {} needs --train-samples (with --train-iters use "
              "--lr-wsd-decay-iters)",
              c.lr_wsd_decay_samples);
    MOE_CHECK(c.lr_warmup_fraction < 0 || c.lr_warmup_iters == 0,
              "--lr-warmup-fraction {} and --lr-warmup-iters {} are exclusive: give one", c.lr_warmup_fraction,
              c.lr_warmup_iters);
  }
  MOE_CHECK(c.lr_warmup_fraction == -1 || (c.lr_warmup_fraction >= 0 && c.lr_warmup_fraction < 1),
            "--lr-warmup-fraction {} must be in [0, 1) (-1: unset)", c.lr_warmup_fraction);
  for (auto [v, name] :
       {std::pair{c.train_iters, "train-iters"}, std::pair{c.lr_decay_iters, "lr-decay-iters"},
        std::pair{c.lr_warmup_iters, "lr-warmup-iters"}, std::pair{c.lr_wsd_decay_iters, "lr-wsd-decay-iters"}}) {
    int64_t product = 0;
    MOE_CHECK(!__builtin_mul_overflow(v, c.global_batch_size, &product),
              "--{} {} x --global-batch-size {} samples (the scheduler counts samples) do not fit in 64 bits", name, v,
              c.global_batch_size);
  }
  if (c.weight_decay_incr_style == "constant") {
    MOE_CHECK(c.start_weight_decay == -1 && c.end_weight_decay == -1,
              "--start-weight-decay/--end-weight-decay need --weight-decay-incr-style linear or cosine (constant "
              "uses --weight-decay)");
  } else {
    MOE_CHECK(c.start_weight_decay >= 0 && c.end_weight_decay >= 0,
              "--weight-decay-incr-style {} needs --start-weight-decay and --end-weight-decay (>= 0)",
              c.weight_decay_incr_style);
  }
  MOE_CHECK(!(c.use_checkpoint_opt_param_scheduler && c.override_opt_param_scheduler),
            "--use-checkpoint-opt_param-scheduler and --override-opt_param-scheduler are exclusive: the schedule "
            "comes from the checkpoint or from the flags");
}

// Megatron's precision-aware optimizer checks (OptimizerConfig, get_megatron_optimizer), and Muon's, which Megatron
// makes as it builds the optimizer.
void validate_optimizer_state(const TrainConfig& c) {
  for (const auto& [flag, dtype] :
       {std::pair<const char*, const std::string&>{"exp-avg-dtype", c.exp_avg_dtype},
        std::pair<const char*, const std::string&>{"exp-avg-sq-dtype", c.exp_avg_sq_dtype}}) {
    MOE_CHECK(dtype == "fp32" || c.use_precision_aware_optimizer,
              "--{} {}: {} can only be fp32 when not using precision-aware optimizer (as Megatron): add "
              "--use-precision-aware-optimizer",
              flag, dtype, flag);
    MOE_CHECK(dtype == "fp32" || dtype == "bf16",
              "--{} {}: Adam moments in {} (scaled states) are not supported by moecore; use bf16 or fp32", flag, dtype,
              dtype);
  }
  if (c.use_precision_aware_optimizer) {
    MOE_CHECK(c.optimizer == "adam",
              "--use-precision-aware-optimizer only supported with adam (as Megatron), not "
              "--optimizer {}",
              c.optimizer);
    MOE_CHECK(c.use_distributed_optimizer,
              "--use-precision-aware-optimizer only supported with distributed optimizer (as Megatron): add "
              "--use-distributed-optimizer");
  }
  if (c.optimizer == "muon" || c.optimizer == "dist_muon") {
    optim::check_newton_schulz(c.muon_coefficient_type, c.muon_num_ns_steps);
    MOE_CHECK(c.num_distributed_optimizer_instances == 1 || (c.optimizer == "muon" && !c.use_distributed_optimizer),
              "--num-distributed-optimizer-instances {} with {}: Megatron's layer-wise distributed optimizer (Muon's) "
              "has one instance; use --num-distributed-optimizer-instances 1 or --optimizer muon without "
              "--use-distributed-optimizer",
              c.num_distributed_optimizer_instances,
              c.optimizer == "dist_muon" ? "--optimizer dist_muon" : "--optimizer muon --use-distributed-optimizer");
  }
}

// Megatron's precision checks (arguments.py, "Parameters dtype"; the scaler's asserts, grad_scaler.py).
void validate_precision(const TrainConfig& c) {
  MOE_CHECK(!(c.fp16 && c.bf16), "--fp16 and --bf16 are exclusive (as Megatron): give one");
  // The main gradients' dtype (arguments.py; optimizer_config.py): --main-grads-dtype other than fp32 only with the
  // precision-aware optimizer, and under --bf16 not beside --accumulate-allreduce-grads-in-fp32.
  MOE_CHECK(c.main_grads_dtype == "fp32" || c.use_precision_aware_optimizer,
            "--main-grads-dtype {}: main_grads_dtype can only be fp32 when not using precision-aware optimizer "
            "(Megatron's rule); add --use-precision-aware-optimizer or drop --main-grads-dtype",
            c.main_grads_dtype);
  MOE_CHECK(!(c.bf16 && c.accumulate_allreduce_grads_in_fp32) || c.main_grads_dtype == "fp32",
            "--main-grads-dtype can only be fp32 when --accumulate-allreduce-grads-in-fp32 is set (Megatron's rule): "
            "drop one of them");
  // The precision-aware optimizer's bf16 copy of fp16 or fp32 gradient buffers is not emulated.
  // (Megatron FSDP reads --megatron-fsdp-main-grads-dtype instead.)
  MOE_CHECK(c.main_grads_dtype == "fp32" || c.bf16 || c.use_megatron_fsdp,
            "--main-grads-dtype {} without --bf16: the precision-aware optimizer's bf16 copy of {} main gradients is "
            "not supported by moecore; use --bf16 (whose gradient buffers are then bf16) or drop --main-grads-dtype",
            c.main_grads_dtype, c.fp16 ? "fp16" : "fp32");
  MOE_CHECK(!grad_precision(c).low() || (c.optimizer != "muon" && c.optimizer != "dist_muon"),
            "--optimizer {} with fp16/bf16 main gradients (--fp16 without --accumulate-allreduce-grads-in-fp32, "
            "--grad-reduce-in-bf16, --main-grads-dtype bf16 or Megatron FSDP's low-precision gradient dtypes): not "
            "supported by moecore; use fp32 main gradients (--accumulate-allreduce-grads-in-fp32, or "
            "--megatron-fsdp-main-grads-dtype fp32) or --optimizer adam",
            c.optimizer);
  MOE_CHECK(!c.fp16 || c.fp8_format.empty(),
            "--fp16 with --fp8-format {}: moecore's FP8 GEMMs cast from bf16 or fp32 operands; use --bf16 with FP8",
            c.fp8_format);
  const bool dynamic = c.fp16 && c.loss_scale == 0;
  MOE_CHECK(!dynamic || c.min_loss_scale <= c.initial_loss_scale,
            "--min-loss-scale {} is above --initial-loss-scale {}: the dynamic scale starts at or above its floor",
            c.min_loss_scale, c.initial_loss_scale);
}

}  // namespace

void validate_optimizer(const TrainConfig& c) {
  validate_optimizer_state(c);
  validate_precision(c);
  MOE_CHECK(c.global_batch_size % c.micro_batch_size == 0,
            "--global-batch-size {} must be a multiple of --micro-batch-size {} x data-parallel size 1",
            c.global_batch_size, c.micro_batch_size);
  validate_schedule_flags(c);
  MOE_CHECK(c.skip_train || c.train_iters > 0, "--train-iters must be positive (or pass --skip-train)");
  validate(lr_schedule(c));
}

}  // namespace moecore::train
