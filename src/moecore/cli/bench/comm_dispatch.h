// `moecore bench comm`'s dispatcher table (comm_dispatch.cpp).
#pragma once

#include "moecore/train/config/config.h"

namespace moecore::cli {

// Under mpirun, one routing (K distinct experts per token drawn uniformly, each rank its own) dispatched and
// combined by the AlltoAll and flex dispatchers with experts over every rank: per dispatcher, the token bytes each
// way and the all-to-all payload the traffic counters measured, beside the analytic counts (assignments x H x
// bytes; distinct (token, destination rank) pairs x H x bytes), summed over ranks. Fails unless flex's token bytes
// equal the analytic count exactly. Collective; prints on rank 0.
void bench_dispatch_bytes(const train::TrainConfig& cfg, bool bf16_rows);

}  // namespace moecore::cli
