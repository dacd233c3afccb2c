// The trainer's side of saving checkpoints: what a save holds (each rank's boxes of the parameters and
// whole-per-parameter Adam moments, the expert bias, the tokenizer, the training state), synchronous and background
// saves with their commit, and retention. Not loading (checkpoint_load.h) nor the files' format, atomicity and
// resharding (ckpt/).
#pragma once

#include <atomic>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "moecore/ckpt/manager.h"
#include "moecore/optim/chained_optimizer.h"
#include "moecore/optim/lr_schedule.h"
#include "moecore/train/model_builder.h"
#include "moecore/train/observe/metrics.h"

namespace moecore::train {

// Where the run stands: what a checkpoint restores besides tensors.
struct Progress {
  int64_t iteration = 0;
  data::SampleCursor cursor;
  IntervalSums sums;
  // Megatron's OptimizerParamScheduler: the schedule (the flags', or the checkpoint's with
  // --use-checkpoint-opt_param-scheduler) and its step count in samples (num_steps).
  optim::LRSchedule schedule;
  int64_t schedule_steps = 0;
  // Steps a loss scaler skipped since the run began (Adam's step count is iteration minus these).
  int64_t skipped_iterations = 0;
};

// Megatron's OptimizerParamScheduler.state_dict (steps in samples): saved, and derived from the saved flags when a
// checkpoint has none.
nlohmann::json scheduler_state(const optim::LRSchedule& s, int64_t num_steps);

// What a checkpoint holds and where it lives in this process: the configuration, the layout, the vocabulary, the
// model's parameters and router state, and the optimizer (null: a model without optimizer state, generation).
// Shared by saving and loading.
class CheckpointedState {
 public:
  CheckpointedState(const TrainConfig& c, std::FILE* out, const ParallelGroups& g, const Vocabulary& vocab,
                    nn::ParamRegistry& reg, nn::GPTModel& model, optim::ChainedOptimizer* opt)
      : c_(c), out_(out), g_(g), vocab_(vocab), reg_(reg), model_(model), opt_(opt) {}

 protected:
  // The name the router's expert bias of `l` is stored under (router state, not a parameter).
  static std::string expert_bias_name(moe::MoELayer& l);
  // The word embedding and the output layer: their rows past the vocabulary are padding.
  static bool is_vocab_parameter(const std::string& name);

  const TrainConfig& c_;
  std::FILE* out_;
  const ParallelGroups& g_;
  const Vocabulary& vocab_;
  nn::ParamRegistry& reg_;
  nn::GPTModel& model_;
  optim::ChainedOptimizer* opt_;
};

// Checkpoints read and write every parameter as its whole f32 weights on the host, and the router state on the
// host: within this scope each parameter's `value` is such a host tensor (the optimizer's master where the model
// holds the parameter in bf16, gathered from its owners under the distributed optimizer: collective; otherwise the
// value, copied where it lives on a GPU or in bf16). commit() hands the values, loaded or not, back to the optimizer
// and the model (rounded where stored in bf16); leaving the scope restores the model's own tensors either way.
class OnHost {
 public:
  OnHost(nn::ParamRegistry& reg, nn::GPTModel& model, optim::ChainedOptimizer* opt);
  ~OnHost();
  OnHost(const OnHost&) = delete;
  OnHost& operator=(const OnHost&) = delete;
  void commit();

 private:
  void restore();
  void move_router_state(Device d);
  nn::ParamRegistry& reg_;
  nn::GPTModel& model_;
  optim::ChainedOptimizer* opt_;
  Device dev_;
  std::vector<Tensor> own_;  // the model's values, put back on leaving
  bool restored_ = false;
};

class CheckpointSaver : public CheckpointedState {
 public:
  using CheckpointedState::CheckpointedState;
  ~CheckpointSaver();

  // Where this run's training starts when it resumes a checkpoint at `p`: its batch size took effect there
  // (consumed_samples follows from it) and that iteration counts as saved.
  void start_at(const Progress& p);
  // Before the first step: --save created, writable, with room for one checkpoint (nothing without --save or an
  // optimizer).
  void check_save_target() const;
  // Saves the whole training state to --save as iteration p.iteration (collective over all ranks). Returns the
  // directory. With --async-save the state is copied now and written by a background thread; the save becomes
  // visible (marker moved) at finish_async. A save still in flight is finished first.
  std::string save(const Progress& p);

  // --async-save: whether a save is in flight, whether this rank's files of it are written (the trainer agrees on
  // that over all ranks at a step boundary), and finishing it (collective: waits for this rank's writer, then
  // commits; every rank throws when any rank's write failed). Nothing to do when none is in flight.
  bool async_pending() const { return async_ != nullptr; }
  bool async_written() const { return async_ && async_->done.load(); }
  void finish_async();

  int64_t last_saved() const { return last_saved_; }

 private:
  // Whether this rank stores p: one rank of those holding the same box (the first DP rank, and the first TP rank
  // for replicated-over-TP parameters; the first EDP rank for experts).
  bool stores(const nn::Parameter& p) const;
  nlohmann::json train_state(const Progress& p) const;
  // The bytes one checkpoint takes (parameters and Adam moments).
  int64_t checkpoint_bytes() const;
  // After a save is visible: deletes this run's older checkpoints that --save-retain-interval and
  // --keep-last-checkpoints let go (rank 0; never one this run did not write, never the newest).
  void retain_after_save(int64_t iteration);

  struct AsyncSave {
    ckpt::PendingSave pending;
    std::vector<ckpt::StoredTensor> mine;  // copies taken at the step boundary
    nlohmann::json state;
    std::vector<std::pair<std::string, std::string>> extra;
    double bytes = 0, started = 0;
    std::thread writer;
    std::atomic<bool> done{false};
    std::string error;  // the writer's failure (read after join)
  };
  std::unique_ptr<AsyncSave> async_;
  std::vector<int64_t> written_;  // iterations this run saved, in order (retention deletes only among these)
  int64_t last_saved_ = -1;
  int64_t run_start_iteration_ = 0, run_start_consumed_ = 0;  // where this run's batch size took effect
};

}  // namespace moecore::train
