// The flag table's rows for Megatron FSDP (see config.h; the table: flag_table.cpp): --use-megatron-fsdp, its
// sharding strategies, its dtypes, the gather double buffer and sharded initialisation, and --fp8-param-gather
// (Megatron's DistributedDataParallelConfig option: what the distributed optimizer or FSDP gathers), at the end of
// the parallelism group. Megatron's rules for them: config_validate_fsdp.cpp, config_fp8.cpp.
#include "moecore/train/config/config.h"

namespace moecore::train {

std::vector<FlagSpec> fsdp_flag_rows() {
  using C = TrainConfig;
  return {
      {"use-megatron-fsdp", &C::use_megatron_fsdp, false,
       "Megatron FSDP: parameters, gradients and optimizer state sharded over the data-parallel group as "
       "--data-parallel-sharding-strategy says (implies --use-distributed-optimizer)"},
      {"data-parallel-sharding-strategy", &C::data_parallel_sharding_strategy, "optim_grads_params",
       "FSDP: no_shard (DDP), optim (ZeRO-1), optim_grads (ZeRO-2: gradient shards only), optim_grads_params "
       "(ZeRO-3: each layer's parameters gathered for its forward and backward, then freed)",
       kNoRole, one_of({"no_shard", "optim", "optim_grads", "optim_grads_params"})},
      {"outer-dp-sharding-strategy", &C::outer_dp_sharding_strategy, "no_shard",
       "FSDP with --num-distributed-optimizer-instances K > 1 (HSDP): no_shard replicates across the K groups, "
       "optim also shards the optimizer state across them (needs optim_grads_params)",
       kNoRole, one_of({"no_shard", "optim"})},
      {"megatron-fsdp-main-params-dtype", &C::megatron_fsdp_main_params_dtype, "fp32",
       "FSDP: dtype of the main (master) parameters: fp32, or auto (the model's; fp32 without --bf16)", kNoRole,
       one_of({"fp32", "bf16", "fp16", "auto"})},
      {"megatron-fsdp-main-grads-dtype", &C::megatron_fsdp_main_grads_dtype, "auto",
       "FSDP: dtype gradients accumulate in: fp32 or auto (moecore's gradients are fp32)", kNoRole,
       one_of({"fp32", "bf16", "fp16", "auto"})},
      {"megatron-fsdp-grad-comm-dtype", &C::megatron_fsdp_grad_comm_dtype, "auto",
       "FSDP: dtype of the gradient reduce-scatter and all-reduce: fp32 or auto (the main gradients')", kNoRole,
       one_of({"fp32", "fp16", "bf16", "auto"})},
      {"fsdp-double-buffer", &C::fsdp_double_buffer, false,
       "FSDP optim_grads_params: gather every unit's parameters into two buffers kept for the run, each the size of "
       "the largest unit (default: a buffer per gathered unit, taken and returned as it goes)"},
      {"init-model-with-meta-device", &C::init_model_with_meta_device, false,
       "FSDP optim_grads_params: each rank initialises only its shard of the parameters (no rank holds the whole "
       "model)"},
      {"fp8-param-gather", &C::fp8_param_gather, false,
       "FP8 primary weights: the FP8 GEMMs' weights kept in FP8 (cast from the fp32 masters after each step) and "
       "all-gathered in FP8; needs --fp8-format and --use-distributed-optimizer or --use-megatron-fsdp"}};
}

}  // namespace moecore::train
