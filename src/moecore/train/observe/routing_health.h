// Routing and loss health alarms, decided after each step on values every rank holds after the step's reductions
// (so every rank warns or stops at the same step): an expert with no tokens for N steps, max/mean expert load above
// a threshold for N steps, router entropy collapse, an aux-loss spike, a loss spike (Megatron's
// --check-for-spiky-loss rule) and a non-finite step under --no-check-for-nan-in-loss-and-grad. Each warns once per
// episode (log + an "alarm" record in the metrics JSONL) or, when named in --health-alarm-stop, stops the run at the
// step boundary before anything of that step is saved. Not the non-finite stop itself (trainer.cpp, health.h).
#pragma once

#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "moecore/nn/gpt_model.h"
#include "moecore/train/config/config.h"
#include "moecore/train/observe/metrics.h"
#include "moecore/train/parallel_groups.h"

namespace moecore::train {

// The alarm names (--health-alarm-stop takes all but "nan": a non-finite step stops unless
// --no-check-for-nan-in-loss-and-grad, which asks to go on).
inline const std::vector<std::string>& health_alarm_names() {
  static const std::vector<std::string> n = {"dead-expert",    "load-imbalance", "router-entropy-collapse",
                                             "aux-loss-spike", "loss-spike",     "nan"};
  return n;
}

// One MoE layer's routing of the step over all ranks: kept assignments per expert (summed over TP×DP×CP) and the
// mean per-token router entropy (nats) over the step's tokens.
struct LayerRouting {
  size_t layer = 0;  // global index among all layers
  std::vector<double> tokens_per_expert;
  double entropy = 0;
};

// The routing statistics of the step just finished, summed over the TP×DP×CP group (each rank routes its own
// tokens) and gathered over the pipeline stages by global layer: identical on every rank. Collective over those
// groups when distributed.
std::vector<LayerRouting> global_routing(const nn::GPTModel& model, const ParallelGroups& g);

struct Alarm {
  std::string name;  // one of health_alarm_names()
  bool stop = false;
  std::string message;
};

// The detectors' state (not checkpointed: a resumed run samples its maxima again, as Megatron's rerun machine).
class HealthAlarms {
 public:
  // `ep_size`: expert-parallel ranks (names the rank holding an expert).
  HealthAlarms(const TrainConfig& c, int64_t ep_size);
  // The alarms raised by step `iteration` (just finished) with result `r` and `routing` (global_routing, one entry
  // per MoE layer in order, as r.aux_layers): at most one per alarm and layer.
  std::vector<Alarm> after_step(int64_t iteration, const StepResult& r, const std::vector<LayerRouting>& routing);

 private:
  struct Spike {  // Megatron's is_unexpectedly_large: the max |value| of the first `samples` values, then frozen
    int64_t count = 0;
    double max = 0;
    bool warned = false;
  };
  // Whether `v` spikes (and the once-per-episode latch): after `samples` values, |v| >= factor × max.
  static bool spiking(Spike& s, double v, double factor, int64_t samples);
  std::string expert_place(int64_t e) const;

  const TrainConfig& c_;
  int64_t ep_size_;
  bool first_step_ = true;
  std::map<size_t, std::vector<int64_t>> idle_;  // per layer, per expert: steps in a row with no tokens
  std::map<size_t, int64_t> imbalanced_, collapsed_;
  std::map<std::pair<size_t, size_t>, Spike> aux_;  // (type, MoE layer)
  Spike loss_;
  bool nan_warned_ = false;
};

// Runs the alarms after step `iteration`: warnings go to `out` (unless --logging-level is above WARNING; `tty`:
// the progress line is cleared first) and to the metrics JSONL as {"alarm": name, ...}; a stop alarm writes its
// record then throws Error naming the iteration, the ranks and the layer/expert, before the step is saved
// (`last_saved`: the last checkpoint's iteration, -1 none). Collective over TP×DP×CP (global_routing).
void run_health_alarms(HealthAlarms& h, int64_t iteration, const StepResult& r, const nn::GPTModel& model,
                       const ParallelGroups& g, MetricsLog& log, std::FILE* out, bool tty, int64_t logging_level,
                       int64_t last_saved);

}  // namespace moecore::train
