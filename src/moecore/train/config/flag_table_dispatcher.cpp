// The flag table's rows for the MoE token dispatcher (see config.h; the table: flag_table.cpp): its type and the
// flex dispatcher's backend. Megatron's rules for them: config_validate_moe.cpp.
#include "moecore/train/config/config.h"

namespace moecore::train {

std::vector<FlagSpec> dispatcher_flag_rows() {
  using C = TrainConfig;
  return {
      {"moe-token-dispatcher-type", &C::moe_token_dispatcher_type, "alltoall",
       "alltoall, allgather or flex (one rank: local dispatch in every case)", kNoRole,
       one_of({"alltoall", "allgather", "flex"})},
      {"moe-flex-dispatcher-backend", &C::moe_flex_dispatcher_backend, "deepep",
       "flex's backend: deepep or hybridep, the same math in moecore (each token crosses to a rank once)", kNoRole,
       one_of({"deepep", "hybridep", "ncclep"})},
      {"moe-enable-deepep", &C::moe_enable_deepep, false,
       "Megatron's older spelling of --moe-flex-dispatcher-backend deepep (needs --moe-token-dispatcher-type flex)"}};
}

}  // namespace moecore::train
