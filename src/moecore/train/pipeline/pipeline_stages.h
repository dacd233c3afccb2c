// Which decoder layers this pipeline rank holds: its model chunks (one per virtual stage) from the stage-layout
// planner (train/pipeline_layout.h: Megatron's even split, uneven first/last stages, the account-for options and
// --pipeline-model-parallel-layout), for the model builder and the schedules.
#pragma once

#include <cstdint>
#include <vector>

#include "moecore/train/pipeline/pipeline_layout.h"

namespace moecore::train {

struct TrainConfig;

// Virtual stages (model chunks) per pipeline rank (1 without interleaving).
int64_t virtual_stages(const TrainConfig& c);

// The chunks of pipeline rank `pp_rank`, chunk index = virtual stage, with global decoder-layer indices; the
// embedding is on rank 0's chunk 0 and the loss on the last rank's last chunk.
std::vector<StageLayers> pipeline_stage_layers(const TrainConfig& c, int64_t pp_rank);

}  // namespace moecore::train
