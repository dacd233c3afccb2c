// This rank's model chunks (see pipeline_stages.h).
#include "moecore/train/pipeline/pipeline_stages.h"

#include "moecore/core/error.h"
#include "moecore/train/config/config.h"

namespace moecore::train {

int64_t virtual_stages(const TrainConfig& c) {
  return plan_pipeline(pipeline_flags(c)).vpp;
}

std::vector<StageLayers> pipeline_stage_layers(const TrainConfig& c, int64_t pp_rank) {
  const PipelineLayout plan = plan_pipeline(pipeline_flags(c));
  MOE_ASSERT(pp_rank >= 0 && pp_rank < plan.pp);
  std::vector<StageLayers> chunks;
  for (int64_t v = 0; v < plan.vpp; v++) chunks.push_back(plan.at(pp_rank, v));
  return chunks;
}

}  // namespace moecore::train
