// The flag table's rows for the main gradients' dtype (see config.h; the table: flag_table.cpp), at the end of the
// training group: Megatron's --accumulate-allreduce-grads-in-fp32, --grad-reduce-in-bf16 and --main-grads-dtype
// (optimizer_config.h grad_precision resolves them; their rules: config_validate_optimizer.cpp).
#include "moecore/train/config/config.h"

namespace moecore::train {

std::vector<FlagSpec> main_grad_flag_rows() {
  using C = TrainConfig;
  return {{"accumulate-allreduce-grads-in-fp32", &C::accumulate_allreduce_grads_in_fp32, false,
           "Main gradients accumulated and reduced in fp32 (the default under --bf16; without it --fp16 keeps them in "
           "fp16)"},
          {"grad-reduce-in-bf16", &C::grad_reduce_in_bf16, false,
           "--bf16: main gradients accumulated and reduced in bf16 (overrides --accumulate-allreduce-grads-in-fp32)"},
          {"main-grads-dtype", &C::main_grads_dtype, "fp32",
           "Main gradients' dtype with --use-precision-aware-optimizer: fp32, or bf16 (with --bf16: accumulated and "
           "reduced in bf16)",
           kNoRole, one_of({"fp32", "bf16"})}};
}

}  // namespace moecore::train
