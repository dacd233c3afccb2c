// Optimizer settings from the flags (see optimizer_config.h).
#include "moecore/train/config/optimizer_config.h"

#include <algorithm>

namespace moecore::train {

optim::GradScalerConfig grad_scaler_config(const TrainConfig& c) {
  using Kind = optim::GradScalerConfig::Kind;
  optim::GradScalerConfig s;
  if ((c.fp16 || c.bf16 || c.use_distributed_optimizer) && c.loss_scale > 0) {
    s.kind = Kind::Constant;
    s.initial_scale = static_cast<float>(c.loss_scale);
  } else if (c.fp16) {
    s.kind = Kind::Dynamic;
    s.initial_scale = static_cast<float>(c.initial_loss_scale);
    s.min_scale = static_cast<float>(c.min_loss_scale);
    s.window = c.loss_scale_window;
    s.hysteresis = c.hysteresis;
  }
  return s;
}

bool check_nan_in_loss_and_grad(const TrainConfig& c) {
  return !c.no_check_for_nan_in_loss_and_grad && grad_scaler_config(c).kind != optim::GradScalerConfig::Kind::Dynamic;
}

optim::GradPrecision grad_precision(const TrainConfig& c) {
  const DType model = c.fp16 ? DType::F16 : c.bf16 ? DType::BF16 : DType::F32;
  auto named = [](const std::string& d, DType automatic) {
    return d == "fp16" ? DType::F16 : d == "bf16" ? DType::BF16 : d == "fp32" ? DType::F32 : automatic;
  };
  optim::GradPrecision g;
  if (c.use_megatron_fsdp) {  // Megatron FSDP reads its own flags only (not grad_reduce_in_fp32)
    g.main = named(c.megatron_fsdp_main_grads_dtype, model);
    g.comm = named(c.megatron_fsdp_grad_comm_dtype, g.main);
    return g;
  }
  // arguments.py: under --bf16, --grad-reduce-in-bf16 turns accumulate_allreduce_grads_in_fp32 off, and without
  // it --main-grads-dtype fp32 (the default) turns it on.
  bool fp32 = c.accumulate_allreduce_grads_in_fp32;
  if (c.bf16) fp32 = !c.grad_reduce_in_bf16 && (fp32 || c.main_grads_dtype == "fp32");
  g.main = g.comm = fp32 ? DType::F32 : model;
  return g;
}

optim::OptimizerConfig optimizer_config(const TrainConfig& c) {
  optim::OptimizerConfig oc;
  oc.adam = {c.lr, c.adam_beta1, c.adam_beta2, c.adam_eps, c.weight_decay};
  oc.clip_grad = c.clip_grad;
  // Megatron: dist_muon is muon with the layer-wise distributed optimizer, which --use-distributed-optimizer
  // also selects for muon; the AdamW beside it is then the ordinary distributed optimizer.
  oc.distributed = c.use_distributed_optimizer || c.optimizer == "dist_muon";
  oc.instances = c.num_distributed_optimizer_instances;
  oc.decoupled = c.decoupled_lr >= 0;
  oc.count_zeros = c.log_num_zeros_in_grad;
  oc.bucket_size = c.ddp_bucket_size;
  oc.check_finite = check_nan_in_loss_and_grad(c);
  oc.scaler = grad_scaler_config(c);
  oc.grad_precision = grad_precision(c);
  // A GPU keeps the norms of the steps between log lines in device memory (the trainer reads them at a log line,
  // a TensorBoard write or a save, or when this many are waiting).
  oc.deferred_norms = std::clamp<int64_t>(c.log_interval, 1, 1024);
  oc.overlap_grad_reduce = c.overlap_grad_reduce;
  oc.overlap_param_gather = c.overlap_param_gather;
  oc.param_gather_with_step = c.overlap_param_gather_with_optimizer_step;
  if (c.use_megatron_fsdp) {  // Megatron FSDP: its sharding strategy, one bucket per unit
    const std::string& s = c.data_parallel_sharding_strategy;
    oc.sharding = s == "no_shard"      ? optim::Sharding::NoShard
                  : s == "optim"       ? optim::Sharding::Optim
                  : s == "optim_grads" ? optim::Sharding::OptimGrads
                                       : optim::Sharding::OptimGradsParams;
    oc.fsdp_double_buffer = c.fsdp_double_buffer;
    oc.fsdp_init_shards = c.init_model_with_meta_device && oc.sharding == optim::Sharding::OptimGradsParams;
    oc.init_seed = static_cast<uint64_t>(c.seed);
    oc.fsdp_outer_shard = c.outer_dp_sharding_strategy == "optim" && c.num_distributed_optimizer_instances > 1;
    oc.bucket_size = 0;
  }
  oc.rule.sgd = c.optimizer == "sgd";
  oc.rule.sgd_momentum = c.sgd_momentum;
  oc.rule.bf16_exp_avg = c.use_precision_aware_optimizer && c.exp_avg_dtype == "bf16";
  oc.rule.bf16_exp_avg_sq = c.use_precision_aware_optimizer && c.exp_avg_sq_dtype == "bf16";
  oc.muon = c.optimizer == "muon" || c.optimizer == "dist_muon";
  optim::MuonConfig& m = oc.muon_cfg;
  m.momentum = c.muon_momentum;
  m.nesterov = c.muon_nesterov;
  m.scale_mode = c.muon_scale_mode;
  m.extra_scale_factor = c.muon_extra_scale_factor;
  m.num_ns_steps = c.muon_num_ns_steps;
  m.coefficient_type = c.muon_coefficient_type;
  // Every precision runs Newton-Schulz in fp32 here: bf16 rounding (torch's "medium" on a GPU) would break
  // layout invariance (docs/differences.md).
  m.bf16_matmul = false;
  m.split_qkv = !c.muon_no_split_qkv;
  m.blockwise = c.muon_tp_mode == "blockwise";
  return oc;
}

optim::LRSchedule decoupled_lr_schedule(const TrainConfig& c, optim::LRSchedule s) {
  s.max_lr = c.decoupled_lr;
  if (c.decoupled_min_lr >= 0) s.min_lr = c.decoupled_min_lr;
  return s;
}

}  // namespace moecore::train
