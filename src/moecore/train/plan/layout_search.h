// `moecore plan --search`: the layouts Megatron allows for a model on a world size (TP, CP, PP with virtual stages,
// EP, recompute), each checked by the flag parser exactly as a launch would be, kept when its worst rank's memory
// plan fits, ranked by the step-time model's predicted throughput. Not the model (step_time.h) nor the printing.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "moecore/train/plan/step_time.h"

namespace moecore::train::plan {

struct Candidate {
  std::vector<std::string> flags;  // the layout flags that launch it (on top of the model's and the run's)
  double memory_bytes = 0;         // the worst rank's plan
  StepPrediction prediction;
  bool given = false;  // the layout of the command line itself
};

struct SearchResult {
  std::vector<Candidate> best;  // fastest first, at most `keep`
  Candidate given;              // the command line's own layout (memory_bytes 0 when it failed)
  bool given_fits = false;
  int64_t tried = 0, valid = 0, fitting = 0;
  int64_t offloaded = 0;  // of the fitting, those that fit only with activation offloading
};

// `args`: the command line's training flags (model, batch, precision, overlaps, layout). Every candidate replaces
// the layout flags of `args`; the rest stays.
SearchResult search_layouts(const std::vector<std::string>& args, int64_t world, double memory_limit,
                            const GpuSpec& gpu, const PlanOptions& options, int keep = 5);

}  // namespace moecore::train::plan
