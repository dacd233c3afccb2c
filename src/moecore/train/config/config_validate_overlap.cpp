// Megatron's rules for its communication overlaps (arguments.py validate_args, TransformerConfig.__post_init__),
// mirrored and no stricter.
#include <algorithm>

#include "moecore/core/error.h"
#include "moecore/train/config/config_validate.h"
#include "moecore/train/pipeline/pipeline_layout.h"
#include "moecore/train/pipeline/pipeline_stages.h"

namespace moecore::train {

namespace {

void validate_param_gather(const TrainConfig& c) {
  if (c.overlap_param_gather) {
    MOE_CHECK(c.use_distributed_optimizer || c.use_megatron_fsdp || c.optimizer == "dist_muon",
              "--overlap-param-gather only supported with distributed optimizer or Megatron FSDP (as Megatron): add "
              "--use-distributed-optimizer");
    MOE_CHECK(c.overlap_grad_reduce, "Must use --overlap-param-gather with --overlap-grad-reduce (Megatron's rule)");
    MOE_CHECK(c.optimizer != "muon" && c.optimizer != "dist_muon",
              "--overlap-param-gather with --optimizer {}: the layer-wise distributed optimizer's parameter gather is "
              "not overlapped in moecore; drop --overlap-param-gather or use --optimizer adam",
              c.optimizer);
  }
  if (c.overlap_param_gather_with_optimizer_step) {
    MOE_CHECK(c.use_distributed_optimizer,
              "--overlap-param-gather-with-optimizer-step only supported with distributed optimizer (as Megatron)");
    MOE_CHECK(c.overlap_param_gather,
              "Must use --overlap-param-gather-with-optimizer-step with --overlap-param-gather (Megatron's rule)");
    MOE_CHECK(plan_pipeline(pipeline_flags(c)).vpp > 1,
              "--overlap-param-gather-with-optimizer-step only supported with interleaved pipeline parallelism (as "
              "Megatron): set --num-layers-per-virtual-pipeline-stage or --num-virtual-stages-per-pipeline-rank");
    // Megatron's use_dist_ckpt is every --ckpt-format but torch.
    MOE_CHECK(c.ckpt_format == "torch",
              "--overlap-param-gather-with-optimizer-step not supported with distributed checkpointing (as Megatron: "
              "--ckpt-format {} is one); pass --ckpt-format torch",
              c.ckpt_format);
  }
}

void validate_expert_overlap(const TrainConfig& c) {
  if (c.overlap_moe_expert_parallel_comm) {
    // Megatron's non-interleaved 1F1B has no combined schedule: it asserts virtual stages under pipelining, with or
    // without --delay-wgrad-compute (a virtual pipeline size of 1 counts as none).
    MOE_CHECK(c.pipeline_model_parallel_size == 1 || plan_pipeline(pipeline_flags(c)).vpp > 1,
              "If enabling EP A2A overlap (--overlap-moe-expert-parallel-comm), virtual pipeline stages must be "
              "specified when --pipeline-model-parallel-size {} > 1 (Megatron's rule; --delay-wgrad-compute does not "
              "lift it): add --num-layers-per-virtual-pipeline-stage or --num-virtual-stages-per-pipeline-rank (2 or "
              "more virtual stages per pipeline rank), or drop --overlap-moe-expert-parallel-comm",
              c.pipeline_model_parallel_size);
    MOE_CHECK(c.expert_model_parallel_size > 1,
              "--overlap-moe-expert-parallel-comm is only supported with expert model parallelism (Megatron's rule): "
              "--expert-model-parallel-size must be > 1");
    MOE_CHECK(c.moe_token_dispatcher_type == "alltoall" || c.moe_token_dispatcher_type == "flex",
              "--overlap-moe-expert-parallel-comm is supported with the alltoall or flex token dispatcher (Megatron's "
              "rule), not --moe-token-dispatcher-type {}",
              c.moe_token_dispatcher_type);
    MOE_CHECK(c.recompute_granularity != "full",
              "disable full recomputation when enabling --overlap-moe-expert-parallel-comm (Megatron's rule)");
    MOE_CHECK(c.recompute_method.empty(),
              "disable --recompute-method when enabling --overlap-moe-expert-parallel-comm (Megatron's rule)");
    MOE_CHECK(c.recompute_num_layers == 0,
              "--recompute-num-layers must be unset when enabling --overlap-moe-expert-parallel-comm (Megatron's "
              "rule)");
    const auto& rm = c.recompute_modules;
    MOE_CHECK(!c.moe_layer_recompute && std::find(rm.begin(), rm.end(), "moe") == rm.end(),
              "disable moe in --recompute-modules when enabling --overlap-moe-expert-parallel-comm (Megatron's rule)");
    MOE_CHECK(c.bf16 || c.fp16,
              "--overlap-moe-expert-parallel-comm is only supported with a bf16 or fp16 model (Megatron's "
              "rule): add --bf16");
    MOE_CHECK(!c.moe_shared_expert_overlap,
              "disable --moe-shared-expert-overlap when enabling --overlap-moe-expert-parallel-comm (Megatron's rule)");
    // combined_1f1b_schedule_for_interleaved_pipelining asserts it in the first step; here before any work.
    MOE_CHECK(c.pipeline_model_parallel_size == 1 || !c.use_megatron_fsdp,
              "EP overlap 1F1B (--overlap-moe-expert-parallel-comm) with FSDP is not supported for interleaved "
              "pipeline parallelism (Megatron's rule): use --pipeline-model-parallel-size 1 or drop "
              "--use-megatron-fsdp");
    MOE_CHECK(c.mtp_num_layers <= 1,
              "MTP supports at most one layer when enabling --overlap-moe-expert-parallel-comm (Megatron's rule), "
              "not --mtp-num-layers {}",
              c.mtp_num_layers);
  }
  if (c.delay_wgrad_compute)
    MOE_CHECK(c.overlap_moe_expert_parallel_comm,
              "--overlap-moe-expert-parallel-comm must be enabled when enabling --delay-wgrad-compute (Megatron's "
              "rule)");
  if (c.overlap_dispatch_backward_with_experts_wgrad) {
    MOE_CHECK(!c.overlap_moe_expert_parallel_comm,
              "--overlap-moe-expert-parallel-comm must be disabled when enabling "
              "--overlap-dispatch-backward-with-experts-wgrad (Megatron's rule)");
    MOE_CHECK(!c.delay_wgrad_compute,
              "--delay-wgrad-compute and --overlap-dispatch-backward-with-experts-wgrad are mutually exclusive; use "
              "only one (Megatron's rule)");
  }
  // The delayed weight gradients are the grouped experts' GEMMs; moecore's FP8 experts compute both gradients in
  // one call.
  MOE_CHECK(c.fp8_format.empty() || !(c.delay_wgrad_compute || c.overlap_dispatch_backward_with_experts_wgrad),
            "--{} with --fp8-format {}: moecore's FP8 experts compute data and weight gradients together, so their "
            "weight gradients cannot be delayed; drop one of the two",
            c.delay_wgrad_compute ? "delay-wgrad-compute" : "overlap-dispatch-backward-with-experts-wgrad",
            c.fp8_format);
}

}  // namespace

void validate_overlap(const TrainConfig& c) {
  validate_param_gather(c);
  validate_expert_overlap(c);
}

}  // namespace moecore::train
