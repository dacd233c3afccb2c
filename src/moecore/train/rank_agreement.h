// Ranks agree before work: every rank of a job must train the same configuration on the same data from the same
// checkpoint. One collective at start compares a hash of what each rank would do; on a mismatch every rank learns
// the first difference (the flag or file, both values, the ranks) and throws it, so all exit with one message
// instead of diverging silently or failing later in a collective with mismatched sizes.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "moecore/comm/process_group.h"
#include "moecore/train/config/config.h"

namespace moecore::train {

// What a rank will do, as (what, value) pairs in a fixed order: every flag of the resolved configuration ("--lr"),
// the sizes of the dataset files of --data-path ("dataset file PREFIX.bin"), and the checkpoint --load resumes
// ("checkpoint in --load": its directory and iteration, or why there is none).
std::vector<std::pair<std::string, std::string>> run_identity(const TrainConfig& c);

// Collective over `world` (every rank calls it, before any other collective): returns when all ranks'
// run_identity agree, else throws Error on every rank naming the first difference.
void check_ranks_agree(const TrainConfig& c, const comm::ProcessGroup& world);

}  // namespace moecore::train
