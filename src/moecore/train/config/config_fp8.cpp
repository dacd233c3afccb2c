// The FP8 flags (Megatron's --fp8-format, --fp8-recipe and the recipes' options; arguments.py and fp8_utils.py):
// validation, the flags that act only with --fp8-format, and their resolution into nn::Fp8Config. Not the recipes'
// arithmetic (nn/fp8_recipe.h).
#include <fmt/format.h>

#include "moecore/core/error.h"
#include "moecore/train/config/config.h"
#include "moecore/train/config/config_validate.h"

namespace moecore::train {

void validate_fp8(const TrainConfig& c) {
  // Megatron's rules (arguments.py; TransformerConfig: fp8_param needs fp8 mode). The gradient-free "inference
  // mode" arguments.py also allows is not a training run.
  if (c.fp8_param_gather) {
    MOE_CHECK(c.use_distributed_optimizer || c.use_megatron_fsdp,
              "--fp8-param-gather only supported with distributed optimizer or megatron fsdp (as Megatron): add "
              "--use-distributed-optimizer or --use-megatron-fsdp");
    MOE_CHECK(!c.fp8_format.empty(),
              "--fp8-param-gather must be used together with fp8 mode (as Megatron): add --fp8-format e4m3 or "
              "hybrid");
    MOE_CHECK(c.optimizer != "muon",
              "--fp8-param-gather with --optimizer muon is not supported by moecore (its Muon updates the matrices "
              "in place, with no fp32 master to cast FP8 weights from): use --optimizer adam or sgd, or drop "
              "--fp8-param-gather");
  }
  if (c.fp8_format.empty()) return;  // Megatron reads the other FP8 flags only with --fp8-format
  MOE_CHECK(c.fp8_recipe != "mxfp8",
            "--fp8-recipe mxfp8: MXFP8 is Blackwell-only; this build targets Hopper and CPUs: use --fp8-recipe "
            "blockwise (1x128 / 128x128 scales), tensorwise or delayed");
  MOE_CHECK(c.fp8_recipe != "custom",
            "--fp8-recipe custom: a custom recipe needs --fp8-quantizer-factory (a Python factory), which moecore does "
            "not have; use --fp8-recipe delayed, tensorwise or blockwise");
  if (c.first_last_layers_bf16) {
    MOE_CHECK(c.num_layers_at_start_in_bf16 <= c.num_layers && c.num_layers_at_end_in_bf16 <= c.num_layers,
              "--num-layers-at-start-in-bf16 {} / --num-layers-at-end-in-bf16 {}: at most --num-layers {}",
              c.num_layers_at_start_in_bf16, c.num_layers_at_end_in_bf16, c.num_layers);
  }
}

std::string fp8_no_effect(const TrainConfig& c) {
  const TrainConfig plain;
  if (!c.fp8_format.empty()) {
    if (!c.first_last_layers_bf16 && (c.num_layers_at_start_in_bf16 != plain.num_layers_at_start_in_bf16 ||
                                      c.num_layers_at_end_in_bf16 != plain.num_layers_at_end_in_bf16))
      return "--num-layers-at-start-in-bf16, --num-layers-at-end-in-bf16: read only with --first-last-layers-bf16 "
             "(as in Megatron)";
    return "";
  }
  const bool given = c.fp8_recipe != plain.fp8_recipe || c.fp8_margin != plain.fp8_margin ||
                     c.fp8_amax_history_len != plain.fp8_amax_history_len ||
                     c.fp8_amax_compute_algo != plain.fp8_amax_compute_algo || c.first_last_layers_bf16 ||
                     c.num_layers_at_start_in_bf16 != plain.num_layers_at_start_in_bf16 ||
                     c.num_layers_at_end_in_bf16 != plain.num_layers_at_end_in_bf16;
  return given ? "--fp8-recipe, --fp8-margin, --fp8-amax-history-len, --fp8-amax-compute-algo, "
                 "--first-last-layers-bf16 and its layer counts: read only with --fp8-format (as in Megatron)"
               : "";
}

nn::Fp8Config fp8_config(const TrainConfig& c) {
  nn::Fp8Config f;
  if (c.fp8_format.empty()) return f;
  f.recipe = nn::parse_fp8_recipe(c.fp8_recipe);
  f.hybrid = c.fp8_format == "hybrid";
  f.margin = c.fp8_margin;
  f.amax_history_len = c.fp8_amax_history_len;
  f.amax_max = c.fp8_amax_compute_algo == "max";
  f.param_gather = c.fp8_param_gather;
  f.num_layers = c.num_layers;
  if (c.first_last_layers_bf16) {
    f.bf16_start = c.num_layers_at_start_in_bf16;
    f.bf16_end = c.num_layers_at_end_in_bf16;
  }
  return f;
}

}  // namespace moecore::train
