// The training loop of `moecore train`: data, model (dense or MoE layers by --moe-layer-freq), AdamW with fp32
// master weights, Megatron's LR schedule, gradient accumulation over micro-batches, global-norm clipping, the
// once-per-global-batch MoE updates, Megatron-style logging (console, progress bar, JSON-lines metrics),
// evaluation and sampling. One process; the distributed issue adds data/expert/tensor parallelism underneath.
#pragma once

#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "moecore/ckpt/hf.h"
#include "moecore/ckpt/manager.h"
#include "moecore/comm/process_group.h"
#include "moecore/data/gpt_dataset.h"
#include "moecore/data/tokenizer.h"
#include "moecore/moe/moe_layer.h"
#include "moecore/nn/gpt_model.h"
#include "moecore/optim/distributed_optimizer.h"
#include "moecore/train/config.h"

namespace moecore::train {

struct StepResult {
  double lm_loss = 0;     // mean over the micro-batches of the step
  double grad_norm = 0;   // before clipping
  double lr = 0;
  std::vector<double> aux_losses;  // per load-balancing type: L/coeff averaged over MoE layers and micro-batches
  double z_loss = 0;
};

class Trainer {
 public:
  // `out` receives the log (stdout for the CLI; only rank 0 writes). The GEMM peak (for MFU) is measured when
  // `measure_peak`. `world`: the ranks to train on (null or one rank: a single process).
  Trainer(TrainConfig cfg, std::FILE* out = stdout, bool measure_peak = true,
          const comm::ProcessGroup* world = nullptr);
  ~Trainer();

  // Runs the configured job: training with periodic logs and evaluation, a final evaluation, then samples.
  void run();
  // One optimizer step on the next global batch (advances the data cursor).
  StepResult train_step();
  // Mean LM loss over `iters` global batches of the validation split (from its start).
  double evaluate(int64_t iters);
  // Continues `prompt` by `n` tokens: greedy when temperature is 0, else temperature + top-k sampling.
  std::string generate(const std::string& prompt, int64_t n, double temperature, int64_t top_k, uint64_t seed);
  // Entropy (nats) of the unigram token distribution of the training data: the loss of a model that ignores
  // context, the bar a trained model must clear.
  double unigram_entropy() const;

  int64_t iteration() const { return iteration_; }
  nn::ParamRegistry& params() { return reg_; }
  nn::GPTModel& model() { return *model_; }
  const TrainConfig& config() const { return cfg_; }
  std::vector<moe::MoELayer*> moe_layers();
  // Model FLOPs of one training step (forward + backward), counted as Megatron counts them for MoE.
  double step_flops() const;
  // Bytes this rank must receive per training step on each named group ("tp", "dp", "edp", "ep", "etp") under
  // bandwidth-optimal collectives, from the model's sizes and the layout alone, with routing taken as uniform:
  // the analytic minimum `moecore bench comm` compares the measured traffic with.
  std::map<std::string, double> analytic_comm_bytes() const;
  const comm::ProcessGroup* world_group() const { return world_group_.get(); }

  // Saves the whole training state to --save as iteration iteration() (collective over all ranks): each rank its
  // own shards of the model and the Adam moments, rank 0 the training state. Returns the directory.
  std::string save_checkpoint();
  // Where the state came from at start: a checkpoint directory, an HF directory, or empty (fresh init).
  const std::string& loaded_from() const { return loaded_from_; }
  // SIGTERM/SIGINT during run() (with --save) end training at the next step boundary with a checkpoint;
  // tests call this instead of raising a signal.
  static void request_stop(int signal);

 private:
  // Start-up from --load / --load-hf / upcycling (see TrainConfig).
  void load_at_start();
  void load_hf(const std::string& dir);
  // --moe-use-upcycling: this MoE model from the dense checkpoint in `dir` (reference §1.14).
  void upcycle(const std::string& dir, const nlohmann::json& state);
  // The checkpoint start-up loads (found before the model is built: its vocabulary padding is kept).
  std::optional<ckpt::FoundCheckpoint> found_;
  std::unique_ptr<ckpt::HFModel> hf_;  // --load-hf (when --load holds no checkpoint)
  void load_checkpoint(const std::string& dir, const nlohmann::json& state);
  // Whether this rank stores p in checkpoints: one rank of those holding the same box (the first DP rank, and
  // the first TP rank for replicated-over-TP parameters; the first EDP rank for experts).
  bool stores(const nn::Parameter& p) const;
  // Adam moments by parameter (registry order), whole per local parameter: gathered from the distributed
  // optimizer's owners, or this rank's own.
  void moments(std::vector<Tensor>& m, std::vector<Tensor>& v) const;
  // Load targets for the model (parameters, expert-bias buffers) and, when `optimizer`, the Adam moments into
  // `m`/`v` (allocated here).
  std::vector<ckpt::LoadTarget> load_targets(bool optimizer, std::vector<Tensor>& m, std::vector<Tensor>& v);
  nlohmann::json train_state() const;
  std::string loaded_from_;
  int64_t last_saved_ = -1;
  bool stop_requested_ = false;

  void log_line(const StepResult& r, double seconds, int64_t steps);
  void print_memory_plan();
  void write_metrics(const std::string& json_line);

  TrainConfig cfg_;
  std::FILE* out_;
  // Data parallelism: this rank's coordinate and the groups gradients and statistics are reduced over.
  int64_t dp_ = 1, dp_rank_ = 0, world_rank_ = 0;
  std::unique_ptr<comm::ProcessGroup> dp_group_, stats_group_, ep_group_, edp_group_, tp_group_, etp_group_,
      world_group_;
  std::unique_ptr<comm::ParallelState> mesh_;
  std::unique_ptr<optim::ShardedAdamW> dist_dense_, dist_expert_;  // --use-distributed-optimizer
  // Gradient buckets, one per layer and one for the rest (embedding, final norm, output layer), each split into
  // dense and expert parts: a bucket's all-reduce starts as soon as its layer's gradients are final in the last
  // micro-batch's backward, overlapping the layers still to go.
  struct Bucket {
    std::vector<nn::Parameter*> params;
    Tensor flat;
    comm::Work work;
  };
  std::vector<Bucket> buckets_;  // [2·layer + expert?], then the rest at 2·num_layers
  void start_bucket(size_t index);
  // Share of a parameter's squared gradient this rank adds to the global norm: 1 over the number of ranks holding
  // the same (reduced) gradient, so the sum over all ranks counts every element once.
  double norm_weight(const nn::Parameter& p) const;
  int64_t edp() const;
  // Sums the partial gradients of replicated-over-TP parameters over the TP group (sequence parallelism).
  void sum_sequence_parallel_grads(const std::vector<nn::Parameter*>& params);
  // Replicated-over-TP parameters per bucket (layer) and all of them; empty without TP.
  std::vector<std::vector<nn::Parameter*>> sp_params_;
  std::vector<nn::Parameter*> sp_params_all_;
  // The transformer layer a parameter belongs to (num_layers for the embedding, final norm and output layer): its
  // gradient bucket.
  size_t layer_of(const nn::Parameter& p) const;
  Tensor sp_flat_;
  void finish_buckets();
  std::unique_ptr<data::Tokenizer> tok_;
  int64_t vocab_ = 0, padded_vocab_ = 0;
  std::array<std::shared_ptr<const data::SampleSource>, 3> data_;
  nn::ParamRegistry reg_;
  std::unique_ptr<nn::GPTModel> model_;
  nn::GPTModel::Stash stash_;
  std::vector<Tensor> adam_m_, adam_v_;
  data::SampleCursor cursor_;
  int64_t iteration_ = 0;
  double peak_gflops_ = 0;
  std::FILE* metrics_ = nullptr;
  // Interval accumulators for the log line.
  double sum_loss_ = 0, sum_norm_ = 0, sum_z_ = 0;
  std::vector<double> sum_aux_;
  int64_t interval_steps_ = 0;
};

}  // namespace moecore::train
