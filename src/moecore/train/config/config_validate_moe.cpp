// validate()'s MoE checks (see config_validate.h): the aux-loss coefficients, what moecore's experts and dispatcher
// are, Megatron's rules for the shared expert's overlap, the router's own checks (moe::validate), and the sizes of
// upcycled experts. Not the expert mesh (config_validate_parallel.cpp) nor --moe-layer-freq (parsed by resolve).
#include <cmath>

#include "moecore/core/error.h"
#include "moecore/train/config/config_validate.h"

namespace moecore::train {

namespace {

// Upcycling's sizes (reference §1.14): g = F_dense / F_moe, experts E = r·g.
void check_upcycled_experts(const TrainConfig& c) {
  const int64_t g = c.moe_upcycling_granularity;
  MOE_CHECK(c.moe_ffn_hidden_size * g == c.ffn_hidden_size,
            "--moe-upcycling-granularity {} cuts the dense FFN of --ffn-hidden-size {} into experts of {}: set "
            "--moe-ffn-hidden-size {}",
            g, c.ffn_hidden_size, c.ffn_hidden_size / g, c.ffn_hidden_size / g);
  MOE_CHECK(c.ffn_hidden_size % g == 0 && c.num_experts % g == 0,
            "--moe-upcycling-granularity {} must divide --ffn-hidden-size {} and --num-experts {}", g,
            c.ffn_hidden_size, c.num_experts);
  MOE_CHECK(c.moe_shared_expert_intermediate_size == 0,
            "--moe-use-upcycling with shared experts is not supported: the dense FFN becomes the routed experts");
}

}  // namespace

namespace {

// Megatron's rules for the flex dispatcher's backend flags (TransformerConfig.__post_init__, unconditional there) and
// the DeepEP dispatcher's construction (TPxEP > 1, with MoE layers). ncclep (NCCL EP through TransformerEngine) is
// Megatron's third backend; moecore implements deepep and hybridep.
void validate_flex_dispatcher(const TrainConfig& c) {
  const bool flex = c.moe_token_dispatcher_type == "flex";
  if (c.moe_enable_deepep) {
    MOE_CHECK(flex,
              "--moe-enable-deepep: the DeepEP backend is only supported with the flex token dispatcher (Megatron's "
              "rule); add --moe-token-dispatcher-type flex or drop --moe-enable-deepep");
    MOE_CHECK(c.moe_flex_dispatcher_backend != "hybridep",
              "--moe-enable-deepep with --moe-flex-dispatcher-backend hybridep: only one backend is supported for the "
              "flex token dispatcher (Megatron's rule); drop one of them");
  }
  const std::string backend = c.moe_enable_deepep ? "deepep" : c.moe_flex_dispatcher_backend;
  if (c.moe_flex_dispatcher_backend == "ncclep" && !c.moe_enable_deepep) {
    MOE_CHECK(flex, "--moe-flex-dispatcher-backend ncclep requires --moe-token-dispatcher-type flex (Megatron's rule)");
    MOE_CHECK(false,
              "--moe-flex-dispatcher-backend ncclep (NCCL EP through TransformerEngine) is not supported by moecore; "
              "use --moe-flex-dispatcher-backend deepep or hybridep (the same routing and math)");
  }
  if (flex && c.moe_pad_expert_input_to_capacity)
    MOE_CHECK(backend != "deepep",
              "--moe-pad-expert-input-to-capacity: the flex token dispatcher with the deepep backend does not support "
              "it (Megatron's rule); use --moe-flex-dispatcher-backend hybridep or drop the padding");
  if (flex && backend == "deepep" && c.num_experts > 0)
    MOE_CHECK(c.expert_tensor_parallel_size * c.expert_model_parallel_size > 1,
              "--moe-token-dispatcher-type flex with the deepep backend requires TPxEP > 1 (Megatron's rule: "
              "--expert-tensor-parallel-size x --expert-model-parallel-size is 1); use "
              "--moe-flex-dispatcher-backend hybridep or --moe-token-dispatcher-type alltoall");
}

}  // namespace

void validate_moe(const TrainConfig& c) {
  validate_flex_dispatcher(c);
  for (const auto& v : c.moe_aux_loss_coeff) {
    const double x = to_double("moe-aux-loss-coeff", v);
    MOE_CHECK(std::isfinite(x) && x >= 0, "--moe-aux-loss-coeff {} is out of range; accepted: finite numbers >= 0", v);
  }
  if (c.num_experts == 0) {
    MOE_CHECK(c.moe_shared_expert_intermediate_size == 0 && c.moe_ffn_hidden_size == 0,
              "--moe-* sizes are set but --num-experts is 0");
    return;
  }
  // Expert biases as Megatron has them: with ETP 1 only (TransformerConfig), and not through upcycling, whose
  // grouped-GEMM path would leave the dense FFN's biases behind.
  MOE_CHECK(c.disable_bias_linear || c.expert_tensor_parallel_size == 1,
            "--expert-tensor-parallel-size {} with linear biases: expert biases need expert tensor parallelism 1 "
            "(as in Megatron); pass --disable-bias-linear or --expert-tensor-parallel-size 1",
            c.expert_tensor_parallel_size);
  MOE_CHECK(c.disable_bias_linear || !c.moe_use_upcycling,
            "--moe-use-upcycling with linear biases is not available: the dense FFN's biases have no place in the "
            "upcycled experts; pass --disable-bias-linear");
  MOE_CHECK(c.moe_grouped_gemm, "moe-grouped-gemm: false is rejected: moecore always runs experts as grouped GEMMs");
  // Megatron's checks of --moe-shared-expert-overlap (TransformerConfig): with shared experts, the alltoall
  // or flex dispatcher, and no shared_experts recompute.
  if (c.moe_shared_expert_overlap && c.moe_shared_expert_intermediate_size > 0) {
    MOE_CHECK(c.moe_token_dispatcher_type == "alltoall" || c.moe_token_dispatcher_type == "flex",
              "--moe-shared-expert-overlap only works with the alltoall or flex token dispatcher (Megatron's rule); "
              "drop --moe-token-dispatcher-type {} or the overlap",
              c.moe_token_dispatcher_type);
    for (const std::string& m : c.recompute_modules)
      MOE_CHECK(m != "shared_experts",
                "--recompute-modules shared_experts cannot work with --moe-shared-expert-overlap (Megatron's rule)");
  }
  moe::validate(moe_layer_config(c));
  if (c.moe_use_upcycling) check_upcycled_experts(c);
}

}  // namespace moecore::train
