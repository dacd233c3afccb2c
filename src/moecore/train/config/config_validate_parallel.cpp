// validate()'s parallel-layout checks (see config_validate.h): the training device, context and pipeline
// parallelism, tensor with sequence parallelism, and the expert mesh's split of the experts. Not whether the world
// divides into the layout (memory_plan.cpp, at start).
#include "moecore/core/error.h"
#include "moecore/train/config/config_validate.h"
#include "moecore/train/config/context_parallel.h"
#include "moecore/train/config/device_support.h"
#include "moecore/train/pipeline/pipeline_layout.h"
#include "moecore/train/pipeline/pipeline_stages.h"

namespace moecore::train {

namespace {

// Pipeline parallelism: Megatron's stage-split checks (train/pipeline_layout.cpp), and what moecore cannot do
// under it.
void check_pipeline_flags(const TrainConfig& c) {
  const int64_t P = c.pipeline_model_parallel_size;
  for (const StageLayers& st : plan_pipeline(pipeline_flags(c)).stages)
    MOE_CHECK(st.mtp_layers == 0 || st.loss,
              "--pipeline-model-parallel-layout {} puts MTP layers (m) on a stage without the loss (L); moecore runs "
              "MTP on the loss stage: move m next to L",
              c.pipeline_model_parallel_layout);
  if (P == 1) return;
  MOE_CHECK(c.generate_prompts.empty(),
            "--generate-prompts with --pipeline-model-parallel-size {}: generation at the end of training runs the "
            "whole model on one rank; drop --generate-prompts and sample from the saved checkpoint with `moecore "
            "generate`",
            P);
}

// Tensor parallelism, always with sequence parallelism here: what it splits must divide.
void check_tensor_parallel(const TrainConfig& c) {
  const int64_t tp = c.tensor_model_parallel_size;
  if (tp == 1) return;
  MOE_CHECK(c.sequence_parallel,
            "--tensor-model-parallel-size {} needs --sequence-parallel: moecore runs tensor parallelism with "
            "sequence parallelism only (Megatron requires it for MoE; add the flag)",
            tp);
  MOE_CHECK(c.disable_bias_linear,
            "--tensor-model-parallel-size {} with linear biases is not available; pass --disable-bias-linear", tp);
  MOE_CHECK(c.num_attention_heads % tp == 0 && c.num_query_groups % tp == 0,
            "--num-attention-heads {} and --num-query-groups {} must be divisible by --tensor-model-parallel-size {}",
            c.num_attention_heads, c.num_query_groups, tp);
  MOE_CHECK(c.seq_length % tp == 0,
            "--seq-length {} must be divisible by --tensor-model-parallel-size {} "
            "(sequence parallelism splits it)",
            c.seq_length, tp);
  MOE_CHECK(c.ffn_hidden_size % tp == 0, "--ffn-hidden-size {} must be divisible by --tensor-model-parallel-size {}",
            c.ffn_hidden_size, tp);
  MOE_CHECK(c.moe_shared_expert_intermediate_size % tp == 0,
            "--moe-shared-expert-intermediate-size {} must be divisible by --tensor-model-parallel-size {}",
            c.moe_shared_expert_intermediate_size, tp);
}

// The expert mesh: EP splits the experts, ETP each expert's FFN; without experts there is nothing to split.
void check_expert_parallel(const TrainConfig& c) {
  if (c.num_experts == 0) {
    MOE_CHECK(c.expert_model_parallel_size == 1, "--expert-model-parallel-size {} needs --num-experts",
              c.expert_model_parallel_size);
    return;
  }
  MOE_CHECK(c.num_experts % c.expert_model_parallel_size == 0,
            "--num-experts {} is not divisible by --expert-model-parallel-size {}", c.num_experts,
            c.expert_model_parallel_size);
  MOE_CHECK(c.moe_ffn_hidden_size % c.expert_tensor_parallel_size == 0,
            "--moe-ffn-hidden-size {} must be divisible by --expert-tensor-parallel-size {}", c.moe_ffn_hidden_size,
            c.expert_tensor_parallel_size);
}

}  // namespace

void validate_parallel(const TrainConfig& c) {
  // --device (docs/cuda.md): a GPU that cannot be used, or a setting GPU training does not cover on a run that would
  // use a GPU (auto with one visible too), refused before any work.
  training_device(c);
  check_context_parallel(c);  // --context-parallel-size, --cp-comm-type, --hierarchical-context-parallel-sizes
  check_pipeline_flags(c);
  check_tensor_parallel(c);
  check_expert_parallel(c);
}

}  // namespace moecore::train
