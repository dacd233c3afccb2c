// Which decoder layers each pipeline stage holds: Megatron's even split over P ranks × v virtual stages (model
// chunks). The stage-layout planner (uneven first/last stages, --pipeline-model-parallel-layout) replaces
// `pipeline_stage_layers` behind the same StageLayers interface; nothing else here decides a layout.
#pragma once

#include <cstdint>
#include <vector>

namespace moecore::train {

struct TrainConfig;

// One model chunk: decoder layers [first_layer, first_layer + num_layers) (global indices), and whether the chunk
// also holds the embedding (first stage, chunk 0) or the final norm, output layer and loss (last stage, last chunk).
struct StageLayers {
  int64_t first_layer = 0, num_layers = 0;
  bool embedding = false, loss = false;
};

// Virtual stages per pipeline rank (1 without interleaving): --num-virtual-stages-per-pipeline-rank, or
// --num-layers / (P x --num-layers-per-virtual-pipeline-stage).
int64_t virtual_stages(const TrainConfig& c);

// The chunks of pipeline rank `pp_rank`, chunk index = virtual stage. Megatron's even split: chunk c of rank r holds
// L/(P·v) layers starting at (c·P + r)·L/(P·v). Checks that the layers divide (message names the flags).
std::vector<StageLayers> pipeline_stage_layers(const TrainConfig& c, int64_t pp_rank);

}  // namespace moecore::train
