// The even pipeline split (see pipeline_stages.h).
#include "moecore/train/pipeline_stages.h"

#include "moecore/core/error.h"
#include "moecore/train/config.h"

namespace moecore::train {

int64_t virtual_stages(const TrainConfig& c) {
  const int64_t P = c.pipeline_model_parallel_size;
  if (c.num_virtual_stages_per_pipeline_rank > 0) return c.num_virtual_stages_per_pipeline_rank;
  if (c.num_layers_per_virtual_pipeline_stage > 0) {
    const int64_t per = c.num_layers_per_virtual_pipeline_stage;
    MOE_CHECK(c.num_layers % (P * per) == 0,
              "--num-layers {} must be divisible by --pipeline-model-parallel-size {} x "
              "--num-layers-per-virtual-pipeline-stage {}",
              c.num_layers, P, per);
    return c.num_layers / (P * per);
  }
  return 1;
}

std::vector<StageLayers> pipeline_stage_layers(const TrainConfig& c, int64_t pp_rank) {
  const int64_t P = c.pipeline_model_parallel_size, v = virtual_stages(c), L = c.num_layers;
  MOE_CHECK(
      L % (P * v) == 0,
      "--num-layers {} must be divisible by --pipeline-model-parallel-size {} x virtual stages per rank {} (the "
      "even split; --decoder-first/last-pipeline-num-layers or --pipeline-model-parallel-layout give uneven ones)",
      L, P, v);
  MOE_ASSERT(pp_rank >= 0 && pp_rank < P);
  const int64_t n = L / (P * v);
  std::vector<StageLayers> chunks;
  for (int64_t chunk = 0; chunk < v; chunk++)
    chunks.push_back({(chunk * P + pp_rank) * n, n, pp_rank == 0 && chunk == 0, pp_rank == P - 1 && chunk == v - 1});
  return chunks;
}

}  // namespace moecore::train
