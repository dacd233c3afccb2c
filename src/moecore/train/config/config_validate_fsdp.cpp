// validate()'s Megatron FSDP checks (see config_validate.h): Megatron's rules for --use-megatron-fsdp and its
// companions (megatron/training/arguments.py validate_args; megatron_fsdp/fully_shard.py for the outer sharding),
// mirrored and no stricter, and the dtypes and combinations moecore refuses by name.
#include <string>
#include <vector>

#include "moecore/core/error.h"
#include "moecore/train/config/config_validate.h"

namespace moecore::train {

namespace {

// The main parameters' dtype: fp32 and auto (the model's: fp32 without --bf16 or --fp16) are what moecore
// computes; a lower-precision main copy is refused by name. The gradient dtypes take every value (Megatron's
// meaning: optimizer_config.h grad_precision).
void validate_fsdp_dtypes(const TrainConfig& c) {
  const std::string& params = c.megatron_fsdp_main_params_dtype;
  const std::string low = c.fp16 ? "fp16" : "bf16";  // the model's low precision, where "auto" takes it
  MOE_CHECK(params == "fp32" || (params == "auto" && !c.bf16 && !c.fp16),
            "--megatron-fsdp-main-params-dtype {}{}: main (master) parameters in {} are not supported by moecore, "
            "which keeps them in fp32; use --megatron-fsdp-main-params-dtype fp32 (Megatron's default)",
            params, params == "auto" ? " with --" + low : "", params == "auto" ? low : params);
}

}  // namespace

void validate_fsdp(const TrainConfig& c) {
  // Megatron: --ckpt-format fsdp_dtensor is only tested with Megatron FSDP.
  MOE_CHECK(c.ckpt_format != "fsdp_dtensor" || c.use_megatron_fsdp,
            "--ckpt-format fsdp_dtensor is only tested with Megatron FSDP (Megatron's rule): add --use-megatron-fsdp "
            "or drop the format");
  if (!c.use_megatron_fsdp) return;
  const std::string& s = c.data_parallel_sharding_strategy;
  MOE_CHECK(c.optimizer == "adam" || c.optimizer == "sgd",
            "Megatron-FSDP does not support the {} optimizer yet (Megatron's rule): use --optimizer adam or sgd",
            c.optimizer);
  MOE_CHECK(s != "optim_grads_params" || c.check_weight_hash_across_dp_replicas_interval == 0,
            "--check-weight-hash-across-dp-replicas-interval is not supported with --data-parallel-sharding-strategy "
            "optim_grads_params (Megatron's rule): no rank holds whole replicas to compare");
  // Megatron requires fsdp_dtensor; moecore's own format (the default) is as layout-independent.
  MOE_CHECK(c.ckpt_format == "fsdp_dtensor" || c.ckpt_format == "moecore",
            "Megatron-FSDP requires the `fsdp_dtensor` checkpointing format (Megatron's rule), not --ckpt-format {}: "
            "pass --ckpt-format fsdp_dtensor (or moecore, the default: both save moecore's layout-independent format)",
            c.ckpt_format);
  MOE_CHECK(!(c.init_model_with_meta_device && s == "no_shard"),
            "Meta device initialization (--init-model-with-meta-device) is not supported or necessary for the "
            "'no_shard' sharding strategy (Megatron's rule): drop it or shard the parameters");
  // Megatron checks it where hybrid sharding is on (an outer group: --num-distributed-optimizer-instances > 1).
  MOE_CHECK(c.outer_dp_sharding_strategy == "no_shard" || c.num_distributed_optimizer_instances == 1 ||
                s == "optim_grads_params",
            "--outer-dp-sharding-strategy optim requires --data-parallel-sharding-strategy optim_grads_params "
            "(Megatron's rule: outer sharding is dependent on inner sharding), not {}",
            s);
  validate_fsdp_dtypes(c);
}

std::string fsdp_no_effect(const TrainConfig& c) {
  const TrainConfig plain;
  std::vector<std::string> flags;
  auto given = [&](bool differs, const char* flag) {
    if (differs) flags.push_back(flag);
  };
  const bool fsdp = c.use_megatron_fsdp;
  const bool zero3 = fsdp && c.data_parallel_sharding_strategy == "optim_grads_params";
  given(!fsdp && c.data_parallel_sharding_strategy != plain.data_parallel_sharding_strategy,
        "--data-parallel-sharding-strategy");
  given((!fsdp || c.num_distributed_optimizer_instances == 1) &&
            c.outer_dp_sharding_strategy != plain.outer_dp_sharding_strategy,
        "--outer-dp-sharding-strategy");
  given(!fsdp && c.megatron_fsdp_main_params_dtype != plain.megatron_fsdp_main_params_dtype,
        "--megatron-fsdp-main-params-dtype");
  given(!fsdp && c.megatron_fsdp_main_grads_dtype != plain.megatron_fsdp_main_grads_dtype,
        "--megatron-fsdp-main-grads-dtype");
  given(!fsdp && c.megatron_fsdp_grad_comm_dtype != plain.megatron_fsdp_grad_comm_dtype,
        "--megatron-fsdp-grad-comm-dtype");
  given(!zero3 && c.fsdp_double_buffer, "--fsdp-double-buffer");
  given(!zero3 && c.init_model_with_meta_device, "--init-model-with-meta-device");
  given(fsdp && c.ddp_bucket_size != plain.ddp_bucket_size, "--ddp-bucket-size");
  if (flags.empty()) return "";
  std::string line;
  for (const auto& f : flags) line += (line.empty() ? "" : ", ") + f;
  return line +
         ": read only by Megatron FSDP (--use-megatron-fsdp), --outer-dp-sharding-strategy only with "
         "--num-distributed-optimizer-instances > 1, the buffer and initialisation flags only where the parameters "
         "are sharded (optim_grads_params), and --ddp-bucket-size not under it (each FSDP unit is one bucket)";
}

}  // namespace moecore::train
