// Numerical faults named instead of guessed: weights checked finite where they enter (an imported or loaded model)
// and leave (a checkpoint); a step whose loss or gradient norm is not finite re-run with a probe on every module to
// name the first tensor that went non-finite; and an alarm for a run that has stopped learning (gradients exactly
// zero, or logits uniform over the vocabulary, for several steps). Not the step itself (trainer.cpp).
#pragma once

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>

#include "moecore/comm/process_group.h"
#include "moecore/data/gpt_dataset.h"
#include "moecore/nn/gpt_model.h"
#include "moecore/optim/optimizer.h"
#include "moecore/train/observe/metrics.h"
#include "moecore/train/parallel_groups.h"
#include "moecore/train/pipeline/schedule.h"

namespace moecore::train {

// Throws Error, on every rank of `world` (null: one process), naming a parameter holding a NaN or infinity in what
// some rank holds of it (`held`: the optimizer's held_values, the shards under Megatron FSDP's optim_grads_params),
// and that rank; `source` says where the weights came from ("the model loaded from X", "refusing to save ...").
// Collective over `world`.
void check_parameters_finite(const std::vector<optim::HeldValues>& held, const std::string& source,
                             const comm::ProcessGroup* world);

// Where a step first went non-finite: re-runs the forward and backward passes of the step's micro-batches (the same
// data and weights; collective over `world` exactly as the step was) with a probe on every module, and names the
// first parameter, module output (forward), gradient a module passed down (backward) or parameter gradient that
// is not finite, in execution order, over all ranks. A parameter's values are those `held` (its shards under
// Megatron FSDP's optim_grads_params); under optim_grads and optim_grads_params the gradients are reduce-scattered
// as each unit's backward ends and no rank holds a whole one afterwards, so parameter gradients are not named there
// (module outputs and the gradients modules pass down are). Leaves the gradients undefined.
std::string locate_nonfinite(nn::GPTModel& model, nn::GPTModel::Stash& stash, nn::ParamRegistry& reg,
                             const std::vector<optim::HeldValues>& held, const data::SampleSource& data,
                             const data::SampleCursor& cursor, const MicroBatches& mb, const comm::ProcessGroup* world);

class PipelineSchedule;
// The same under pipeline parallelism: the step's passes re-run through the stages by `schedule` (without the
// optimizer's gradient hooks; collective over `world` as the step was). Places are ordered parameters (stage by
// stage), then per micro-batch its forward through the model chunks in model order and its backward in reverse,
// then the parameter gradients; the first over all ranks is named with its rank and stage.
std::string locate_nonfinite_pipeline(nn::GPTModel& model, nn::ParamRegistry& reg,
                                      const std::vector<optim::HeldValues>& held, PipelineSchedule& schedule,
                                      const data::SampleSource& data, const data::SampleCursor& cursor,
                                      const MicroBatches& mb, const comm::ProcessGroup& world, int64_t pp_rank,
                                      int64_t pp_size);

// Megatron's --check-weight-hash-across-dp-replicas-interval: every data-parallel replica of every parameter holds
// the same bytes (dense parameters over DP, experts over EDP). Throws Error naming the first parameter that differs
// and `iteration`. Collective over the DP and EDP groups; nothing for a single process.
void check_weight_hashes_across_dp(const nn::ParamRegistry& reg, const ParallelGroups& g, int64_t iteration);

// Warns once a run has not learned for `steps` steps in a row: a gradient norm of exactly zero (every gradient
// zero), or an LM loss equal to ln(vocabulary rows) (uniform logits).
class StallAlarm {
 public:
  StallAlarm(int64_t vocab_rows, int64_t steps = 5)
      : log_vocab_(std::log(static_cast<double>(vocab_rows))), n_(steps) {}
  // The warning to print after this step, once per stall.
  std::optional<std::string> after_step(const StepResult& r);

 private:
  double log_vocab_;
  int64_t n_, zero_ = 0, uniform_ = 0;
  bool warned_ = false;
};

}  // namespace moecore::train
