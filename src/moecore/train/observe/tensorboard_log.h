// TensorBoard logging with Megatron's tags (training.py training_log and evaluate_and_print_results,
// moe_utils.py track_moe_metrics, timers.py write), into an event file (tensorboard_writer.h) in --tensorboard-dir.
// Every rank holds one (the per-layer MoE values and the expert loads are summed over ranks: those calls are
// collective); only the last rank of the world writes, as Megatron's SummaryWriter does.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "moecore/nn/gpt_model.h"
#include "moecore/train/config/config.h"
#include "moecore/train/observe/metrics.h"
#include "moecore/train/observe/tensorboard_writer.h"
#include "moecore/train/observe/timer_log.h"
#include "moecore/train/parallel_groups.h"

namespace moecore::train {

// (tag, value) pairs for the training scalars that have a " vs samples" twin (params-norm, num-zeros, ...).
using Scalars = std::vector<std::pair<std::string, double>>;

class TensorBoardLog {
 public:
  TensorBoardLog(const TrainConfig& c, const ParallelGroups& g);
  void set_device(Device d) { device_ = d; }  // whose allocator the mem-* scalars read
  // On every rank after each training step (collective at --tensorboard-log-interval steps of an MoE model; the
  // per-layer losses come reduced in `r`, from router_losses). At --tensorboard-log-interval steps: learning-rate,
  // batch-size, lm loss, loss-scale, world-size, grad-norm, `extra`, mem-* (each with its " vs samples" twin but
  // mem-*) and moe/tokens_per_expert_layer_N histograms; at every step the MoE losses (load_balancing_loss, ...,
  // z_loss) and with --moe-per-layer-logging moe/<loss>_layer_N for every layer N (0 for dense layers).
  void after_step(int64_t iteration, int64_t consumed_samples, const StepResult& r, const nn::GPTModel& model,
                  const Scalars& extra = {});
  // At --log-interval steps, with --log-timers-to-tensorboard: iteration-time (seconds per iteration over the
  // interval) and "<name>-time" for each timer the log shows (train/timers.h: the max over ranks, in seconds per
  // iteration, as Megatron's timers.write).
  void at_log_interval(int64_t iteration, double seconds_per_iteration, const std::vector<TimerRow>& timers = {});
  // After an evaluation: lm loss validation (+ ppl with --log-validation-ppl-to-tensorboard), and vs samples.
  void validation(int64_t iteration, int64_t consumed_samples, double loss);
  void flush();
  // The event file this rank writes ("" on the others).
  std::string path() const { return writer_ ? writer_->path() : ""; }

 private:
  Device device_ = Device::cpu();
  const TrainConfig& c_;
  const ParallelGroups& g_;
  int64_t world_size_ = 1;
  std::unique_ptr<EventFileWriter> writer_;  // the last rank's
  void scalar(const std::string& tag, double v, int64_t step);
  void moe_losses(int64_t iteration, const StepResult& r, const nn::GPTModel& model);
  void gather_over_pipeline(std::vector<std::pair<size_t, std::vector<int64_t>>>& layers, int64_t& n) const;
  void expert_loads(int64_t iteration, const nn::GPTModel& model);
};

}  // namespace moecore::train
