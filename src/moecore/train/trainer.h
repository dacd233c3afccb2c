// The training run of `moecore train`: builds the groups, vocabulary, data, model, optimizer and checkpointing
// from one resolved configuration, then runs DESIGN's "one training step" in a loop with logging, evaluation,
// checkpoints and samples. The pieces live in their own files: model_builder (what is trained), schedule (the
// micro-batch loop), optim/chained_optimizer (gradients, norm, clipping, AdamW), checkpoint_save and _load, metrics,
// cost_model, generate.
#pragma once

#include <array>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "moecore/comm/process_group.h"
#include "moecore/moe/moe_layer.h"
#include "moecore/nn/gpt_model.h"
#include "moecore/optim/chained_optimizer.h"
#include "moecore/train/activation_offload.h"
#include "moecore/train/checkpoint_load.h"
#include "moecore/train/config/config.h"
#include "moecore/train/model_builder.h"
#include "moecore/train/observe/health.h"
#include "moecore/train/observe/metrics.h"
#include "moecore/train/observe/routing_health.h"
#include "moecore/train/observe/tensorboard_log.h"
#include "moecore/train/observe/timer_log.h"
#include "moecore/train/parallel_groups.h"
#include "moecore/train/pipeline/pipeline_schedule.h"
#include "moecore/train/pipeline/schedule.h"

namespace moecore::train {

class Trainer {
 public:
  // `out` receives the log (stdout for the CLI; only rank 0 writes). The GEMM peak (for MFU) is measured when
  // `measure_peak`. `world`: the ranks to train on (null or one rank: a single process).
  Trainer(TrainConfig cfg, std::FILE* out = stdout, bool measure_peak = true,
          const comm::ProcessGroup* world = nullptr);
  ~Trainer();

  // Runs the configured job: training with periodic logs and evaluation, a final evaluation, then samples.
  void run();
  // One optimizer step on the next global batch (advances the data cursor). On one GPU the gradient norm stays in
  // device memory unless `read_norm` (then it is read at the end of the step, one read-back): the result says
  // grad_norm_on_device, and settle_norms reads it later.
  StepResult train_step(bool read_norm = true);
  // The steps whose norm stayed on the GPU, in order, with their norms read (one read-back for all); empty when
  // none. A norm that was not finite (with --check-for-nan-in-loss-and-grad, Megatron's default) stops here as
  // train_step stops on a non-finite loss, naming the first such step: the GPU applied none of the updates from
  // that step on.
  std::vector<StepResult> settle_norms();
  // Mean LM loss over `iters` global batches of the validation split (from its start).
  double evaluate(int64_t iters);
  // Continues `prompt` by `n` tokens: greedy when temperature is 0, else temperature + top-k sampling.
  std::string generate(const std::string& prompt, int64_t n, double temperature, int64_t top_k, uint64_t seed);
  // Entropy (nats) of the unigram token distribution of the training data: the loss of a model that ignores
  // context, the bar a trained model must clear.
  double unigram_entropy() const;

  int64_t iteration() const { return progress_.iteration; }
  nn::ParamRegistry& params() { return reg_; }
  Device device() const { return device_; }  // where the model trains (--device)
  Timers& timers() { return *timers_; }      // this run's (--timing-log-level)
  nn::GPTModel& model() { return *model_; }
  const optim::ChainedOptimizer& optimizer() const { return *opt_; }
  const PipelineSchedule* pipeline() const { return pipeline_; }  // null without pipeline parallelism
  const TrainConfig& config() const { return cfg_; }
  const MemoryPlan& memory_plan() const { return plan_; }  // this rank's, printed at start
  // The allocator's peak over the trainer's construction (bytes, everything live then counted), before it reset the
  // peak for training: what building the model and optimizer took at most (--init-model-with-meta-device's test).
  int64_t startup_peak_bytes() const { return startup_peak_; }
  ActivationOffload* activation_offload() { return offload_.get(); }  // null without --offload-modules
  std::vector<moe::MoELayer*> moe_layers() { return train::moe_layers(*model_); }
  // Model FLOPs of one training step (forward + backward), counted as Megatron counts them for MoE.
  double step_flops() const;
  // Bytes this rank must receive per training step on each named group (see cost_model.h).
  std::map<std::string, double> analytic_comm_bytes() const;
  const comm::ProcessGroup* world_group() const { return groups_->world.get(); }

  // Saves the whole training state to --save as iteration iteration() (collective over all ranks); refuses
  // parameters that are not finite. Returns the directory.
  std::string save_checkpoint();
  // Where the state came from at start: a checkpoint directory, an HF directory, or empty (fresh init).
  const std::string& loaded_from() const { return loaded_from_; }
  // A stop signal during run() (see train/signals.h) ends training at the next step boundary, with a checkpoint
  // when --save is given; tests call this instead of raising a signal.
  static void request_stop(int signal);

 private:
  void make_device_current() const;
  MicroBatches micro_batches() const;
  // The training loop of run(): returns early on a stop signal or --exit-interval.
  void train_loop();
  void final_report();
  // Megatron's timers.log (collective): `names`' milliseconds per `normalizer` over the ranks, printed in
  // --timing-log-option's form (and, at a log line `iteration` >= 0, its metrics-file record). Resets them.
  std::vector<TimerRow> log_timers(const std::vector<std::string>& names, double normalizer = 1.0,
                                   int64_t iteration = -1);
  void level_1_barrier() const;  // Megatron's barrier_with_L1_time (off with --no-barrier-with-level-1-timing)
  // Whether the train loop reads the GPU's deferred norms after iteration `it` (a log line, a TensorBoard write, a
  // save or an exit, a full ring, or per-step consumers of the norm).
  bool must_settle(int64_t it) const;
  // The --check-for-nan-in-loss-and-grad stop: locates the first non-finite value of the step at `cursor` and
  // throws. `not_applied_after`: later steps that ran before the GPU's norm was read (none of them applied).
  [[noreturn]] void stop_nonfinite(int64_t iteration, double lm_loss, double grad_norm,
                                   const data::SampleCursor& cursor, int64_t not_applied_after);

  TrainConfig cfg_;
  std::unique_ptr<Timers> timers_;  // --timing-log-level (current while a step, an evaluation or a save runs)
  std::FILE* out_;
  std::FILE* null_out_ = nullptr;  // ranks other than 0 log here
  std::unique_ptr<ParallelGroups> groups_;
  Vocabulary vocab_;
  std::array<std::shared_ptr<const data::SampleSource>, 3> data_;
  nn::ParamRegistry reg_;
  Device device_ = Device::cpu();
  std::unique_ptr<ActivationOffload> offload_;  // outlives the model's stashes that use it
  std::unique_ptr<nn::GPTModel> model_;
  nn::GPTModel::Stash stash_;
  std::unique_ptr<optim::ChainedOptimizer> opt_;
  std::unique_ptr<Schedule> schedule_;
  PipelineSchedule* pipeline_ = nullptr;  // schedule_ under pipeline parallelism
  std::unique_ptr<CheckpointSaver> ckpt_;
  std::string loaded_from_;  // where the state came from at start (load_at_start)
  std::unique_ptr<MetricsLog> log_;
  std::unique_ptr<TensorBoardLog> tb_;  // --tensorboard-dir
  std::unique_ptr<StallAlarm> stall_;
  std::unique_ptr<HealthAlarms> health_;  // routing and loss health alarms
  Progress progress_;
  struct DeferredStep {
    StepResult r;
    int64_t iteration;
    data::SampleCursor cursor;  // the step's batch (a non-finite norm's step is located from it)
  };
  std::vector<DeferredStep> deferred_;  // steps whose norm is still in the GPU's memory, in order
  double peak_gflops_ = 0;
  int64_t startup_peak_ = 0;
  MemoryPlan plan_;
  bool duration_exit_ = false;   // --exit-duration-in-mins passed on some rank (agreed with the stop signal)
  int stop_signal_ = 0;          // the signal that stops training at this step boundary (agreed over all ranks)
  int64_t eod_mask_token_ = -1;  // --eod-mask-loss: the EOD token (-1: every token has a loss)
};

}  // namespace moecore::train
