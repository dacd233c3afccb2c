// validate()'s checks of fine-grained activation offloading (see config_validate.h): Megatron's TransformerConfig
// rules for --fine-grained-activation-offloading and --offload-modules (transformer_config.py __post_init__, and
// arguments.py's transformer-impl check). Not what each module offloads (train/activation_offload.h).
#include <string>

#include "moecore/core/error.h"
#include "moecore/train/config/config_validate.h"
#include "moecore/train/config/megatron_flags.h"

namespace moecore::train {

void validate_offload(const TrainConfig& c) {
  const auto& m = c.offload_modules;
  if (!c.fine_grained_activation_offloading) return;  // Megatron reads the other offloading flags only with it
  MOE_CHECK(!m.empty(),
            "--fine-grained-activation-offloading needs --offload-modules (as Megatron): name the modules whose "
            "stashes go to host memory, e.g. --offload-modules core_attn expert_fc1");
  MOE_CHECK(given_megatron_values(c.no_effect, "transformer-impl") != std::vector<std::string>{"local"},
            "fine-grained activation offloading is only supported with --transformer-impl transformer_engine (as "
            "Megatron); drop --transformer-impl local");
  MOE_CHECK(!holds(m, "attn_proj") || holds(m, "core_attn"),
            "--offload-modules attn_proj needs core_attn too (as Megatron): attn_proj's input is core_attn's output, "
            "which core_attn's backward also reads");
  MOE_CHECK(!holds(m, "gdp_qkv"),
            "--offload-modules gdp_qkv offloads gated delta-net attention's QKV preparation "
            "(--experimental-attention-variant), which moecore does not have; name the attention's modules instead "
            "(qkv_linear, core_attn, attn_proj)");
  const bool recompute_moe =
      c.recompute_granularity == "selective" && holds(c.recompute_modules, "moe");  // (the default core_attn: no moe)
  for (const char* inside : {"moe_act", "expert_fc1", "fused_group_mlp"})
    MOE_CHECK(!recompute_moe || !holds(m, inside),
              "--offload-modules {} with --recompute-modules moe (as Megatron refuses): recomputing the whole MoE "
              "layer keeps only its input, so there is nothing inside it to offload; drop one of them",
              inside);
  if (holds(m, "fused_group_mlp")) {
    MOE_CHECK(given_megatron_values(c.no_effect, "use-transformer-engine-op-fuser").has_value(),
              "--offload-modules fused_group_mlp needs --use-transformer-engine-op-fuser (as Megatron)");
    MOE_CHECK(!holds(m, "expert_fc1") && !holds(m, "moe_act"),
              "--offload-modules fused_group_mlp offloads the whole grouped MLP and cannot be combined with expert_fc1 "
              "or moe_act (as Megatron); drop those");
  }
}

}  // namespace moecore::train
