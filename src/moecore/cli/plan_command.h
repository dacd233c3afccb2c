// `moecore plan`: the memory plan of a training run without running it (no MPI, nothing allocated): the train
// flags (the one flag table, --model presets), any layout up to thousands of ranks (--world-size N, or the product
// of the layout flags), per-rank memory by category for the worst pipeline stage; with --device-memory-gib N
// whether it fits and, if not, the first of Megatron's best-practice changes that makes it fit (raise EP, recompute
// moe_act and layernorm, PP, the distributed optimizer). The numbers are the start-of-run plan's
// (train/memory_plan.h).
#pragma once

#include <cstdio>
#include <string>
#include <vector>

namespace moecore::cli {

// argv after "plan": its own flags (--world-size, --device-memory-gib) and the train flags. Returns the exit
// status (0: fits or no device size given; 3: does not fit and no change found).
int run_plan(const std::vector<std::string>& args, std::FILE* out);

}  // namespace moecore::cli
