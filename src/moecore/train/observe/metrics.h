// What a run reports: the step's numbers (loss, grad norm, lr, aux and z losses aggregated over MoE layers and
// ranks as Megatron logs them), interval averages, the log line, the JSON-lines metrics file, the memory plan at
// start and the per-expert load bars at the end. Reads the model and the run's groups; changes neither.
#pragma once

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "moecore/core/file.h"
#include "moecore/core/progress.h"
#include "moecore/nn/gpt_model.h"
#include "moecore/optim/chained_optimizer.h"
#include "moecore/train/config/config.h"
#include "moecore/train/memory_plan.h"
#include "moecore/train/parallel_groups.h"

namespace moecore::train {

struct StepResult {
  double lm_loss = 0;    // over the loss tokens of the global batch (Megatron)
  double grad_norm = 0;  // before clipping
  // One GPU: the norm stayed in device memory (grad_norm is 0 until Trainer::settle_norms reads it).
  bool grad_norm_on_device = false;
  double lr = 0;
  std::vector<double> aux_losses;  // per load-balancing type: L/coeff averaged over MoE layers and micro-batches
  double z_loss = 0;
  std::vector<double> mtp_losses;  // MTP depth k's mean loss (Megatron's `mtp_k loss`), averaged over DP
  // The same per MoE layer (in layer order; the totals above are their means): [type][MoE layer], [MoE layer].
  std::vector<std::vector<double>> aux_layers;
  std::vector<double> z_layers;
  std::vector<int64_t> moe_layer_ids;  // the global index of each MoE layer (every pipeline stage's)
  // With --log-params-norm / --log-num-zeros-in-grad (param_stats): the L2 norm of every parameter after the
  // update, and the zero entries of the gradients the step used, each element counted once over all ranks.
  double params_norm = 0;
  int64_t num_zeros = 0;
  double forward_backward_seconds = 0, optimizer_seconds = 0;  // Megatron's timers of the same names
  // Loss scaling (optim/grad_scaler.h): the scale after the step's update (what Megatron logs), and whether the step
  // was skipped for an inf or NaN in its gradients (no update, the learning-rate schedule not advanced).
  double loss_scale = 1.0;
  bool skipped = false;
};

// Aux losses and z-loss of the step just finished, as Megatron logs them: L/coeff per layer, averaged over MoE
// layers and micro-batches, summed over TP (each TP rank holds its tokens' share), averaged over DP (global_aux_loss
// shares are parts of one global-batch loss: summed). Collective over the TP×DP group.
void router_losses(const TrainConfig& c, const nn::GPTModel& model, const ParallelGroups& g, StepResult& r);

// Megatron's calc_params_l2_norm (--log-params-norm) into r: every parameter element counted once whatever the
// layout (a rank weighs its share by 1 over the ranks holding the same values, as the gradient norm does), summed
// over the world, from the optimizer's fp32 masters where it keeps them (`opt`; null: the values). Call after the
// update. Collective over the world with the flag; nothing otherwise.
// (--log-num-zeros-in-grad: ChainedOptimizer::num_zeros_in_grad, counted as the gradients are reduced.)
void param_stats(const TrainConfig& c, const nn::ParamRegistry& reg, const ParallelGroups& g,
                 const optim::ChainedOptimizer* opt, StepResult& r);

// The MTP losses of the step just finished into r.mtp_losses, as Megatron's MTPLossLoggingHelper: each depth's
// mean loss per micro-batch, averaged over micro-batches and DP (the loss stage's; TP ranks hold equal copies).
// Collective over the world with --mtp-num-layers; nothing otherwise.
void mtp_losses(const TrainConfig& c, nn::GPTModel& model, const ParallelGroups& g, StepResult& r);

// Sums of the steps since the last log line (checkpointed, so a resumed run logs the same averages).
// A skipped step (StepResult::skipped) adds to none of the averages: it counts in `skipped`, and in `nan` where its
// loss was not finite (Megatron's "number of skipped iterations" and "number of nan iterations").
struct IntervalSums {
  double lm_loss = 0, grad_norm = 0, z_loss = 0;
  std::vector<double> aux, mtp;
  int64_t steps = 0;  // the steps applied (Megatron's advanced iterations)
  int64_t skipped = 0, nan = 0;
  int64_t iterations() const { return steps + skipped; }
  void add(const StepResult& r);
  nlohmann::json to_json() const;
  static IntervalSums from_json(const nlohmann::json& j);
};

std::string human_bytes(double bytes);
using moecore::format_duration;  // core/progress.h: m:ss, or h:mm:ss from an hour on
// The line a single-process run redraws on a terminal after each step (between its log lines): iteration, the
// step's loss, tokens/s and the time left at the run's rate so far.
std::string progress_line(int64_t iteration, int64_t train_iters, double lm_loss, double tokens_per_sec,
                          double eta_seconds);

class MetricsLog {
 public:
  // `out`: the console (null: nothing printed); `metrics_file`: JSON lines (empty: none), appended when `resume`;
  // `world_size`: the ranks the throughput per GPU divides by. `groups` (distributed runs): the routing statistics
  // of the log line (tokens per expert, router entropy, dropped assignments, max/mean load) are the step's over
  // all ranks (summed over TP×DP, one all-reduce per log line, so log_interval is then collective); without, this
  // rank's.
  MetricsLog(const TrainConfig& c, std::FILE* out, const std::string& metrics_file, bool resume, int64_t world_size = 1,
             const ParallelGroups* groups = nullptr);
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;

  // The log line of the interval ending at `iteration` (averages of `sums`, which it then clears), with the
  // throughput of `seconds` over `steps` steps and the MoE layers' routing statistics of the last step.
  void log_interval(int64_t iteration, int64_t consumed_samples, const StepResult& last, IntervalSums& sums,
                    double seconds, double step_flops, double peak_gflops, const nn::GPTModel& model);
  void log_validation(int64_t iteration, double loss);
  // Adds the step's Megatron timers (forward-backward, optimizer); the metrics file's line carries their mean
  // seconds per iteration since the last line, the slowest rank's with `groups` (as Megatron's timers.write), as
  // "timers/forward-backward" and "timers/optimizer".
  void after_step(const StepResult& r);
  void write_json(const nlohmann::json& line);
  // The memory plan's total for this rank, logged beside the allocator's measured peak on every log line.
  void set_planned_memory(double bytes) { planned_memory_ = bytes; }
  void set_device(Device d) { device_ = d; }  // whose allocator's peak the log shows

 private:
  const TrainConfig& c_;
  std::FILE* out_;
  int64_t world_size_;
  const ParallelGroups* groups_;
  double planned_memory_ = 0;
  Device device_ = Device::cpu();
  double forward_backward_seconds_ = 0, optimizer_seconds_ = 0;  // since the last log line (after_step)
  LineFile file_;  // every line checked: a full disk ends the run naming the file
};

// Parameters, gradients, optimizer state and activations per micro-batch of the built model (this rank's
// parameters), printed before the first step and returned (memory_plan.h).
MemoryPlan print_memory_plan(std::FILE* out, const TrainConfig& c, const nn::ParamRegistry& reg, int64_t vocab,
                             int64_t padded_vocab, const ParallelGroups& g);
// Where the last step's tokens went, one bar per expert, layer by layer.
void print_expert_load(std::FILE* out, const nn::GPTModel& model, bool distributed);

}  // namespace moecore::train
