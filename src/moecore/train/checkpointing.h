// The trainer's side of checkpoints: what a save holds (each rank's boxes of the parameters and whole-per-parameter
// Adam moments, the expert bias, the tokenizer, the training state) and what start-up loads (--load with its resume
// rules, --load-hf, --moe-use-upcycling). File formats, atomicity and resharding are ckpt/'s.
#pragma once

#include <atomic>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "moecore/ckpt/hf.h"
#include "moecore/ckpt/manager.h"
#include "moecore/ckpt/metadata.h"
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
};

// What start-up will load, found before the model is built (a loaded model keeps its vocabulary padding).
struct StartPoint {
  std::optional<ckpt::FoundCheckpoint> checkpoint;  // --load, when it holds one
  std::unique_ptr<ckpt::HFModel> hf;                // --load-hf, when --load holds no checkpoint
  int64_t vocab_rows = 0;                           // the saved model's vocabulary rows (0: unknown)
  std::vector<std::string> set_aside;               // uncommitted saves of --save set aside, one line each
};
// Collective over `world` (null: one process) when --save holds uncommitted saves (ckpt/manager.h).
StartPoint find_start_point(const TrainConfig& c, const comm::ProcessGroup* world = nullptr);

class Checkpointing {
 public:
  // `opt` null: a model without optimizer state (generation).
  Checkpointing(const TrainConfig& c, std::FILE* out, const ParallelGroups& g, const Vocabulary& vocab,
                nn::ParamRegistry& reg, nn::GPTModel& model, optim::ChainedOptimizer* opt);

  // Start-up from `start` (see TrainConfig: --load, --load-hf, --moe-use-upcycling) into the model, the optimizer
  // and `p`. Upcycling saves the upcycled model at once.
  void load_at_start(StartPoint& start, Progress& p);
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
  ~Checkpointing();

  // Where the state came from at start: a checkpoint directory, an HF directory, or empty (fresh init).
  const std::string& loaded_from() const { return loaded_from_; }
  int64_t last_saved() const { return last_saved_; }

 private:
  void load_checkpoint(const std::string& dir, const nlohmann::json& state, Progress& p);
  void load_hf(ckpt::HFModel& m);
  // --moe-use-upcycling: this MoE model from the dense checkpoint in `dir` (reference §1.14).
  void upcycle(const std::string& dir, const nlohmann::json& state);
  // Whether this rank stores p: one rank of those holding the same box (the first DP rank, and the first TP rank
  // for replicated-over-TP parameters; the first EDP rank for experts).
  bool stores(const nn::Parameter& p) const;
  // Load targets for the model (parameters, expert-bias buffers) and, when `optimizer`, the Adam moments into
  // `m`/`v` (allocated here).
  std::vector<ckpt::LoadTarget> load_targets(bool optimizer, std::vector<Tensor>& m, std::vector<Tensor>& v);
  nlohmann::json train_state(const Progress& p) const;
  void refresh_master();
  // The bytes one checkpoint takes (parameters and Adam moments), and the --save checks before the first step.
  int64_t checkpoint_bytes() const;
  void check_save_target();

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

  const TrainConfig& c_;
  std::FILE* out_;
  const ParallelGroups& g_;
  const Vocabulary& vocab_;
  nn::ParamRegistry& reg_;
  nn::GPTModel& model_;
  optim::ChainedOptimizer* opt_;
  std::string loaded_from_;
  int64_t last_saved_ = -1;
  int64_t run_start_iteration_ = 0, run_start_consumed_ = 0;  // where this run's batch size took effect
};

}  // namespace moecore::train
