// Megatron's ChainedOptimizer: the dense and the expert optimizer behind one interface, one global gradient norm
// over both (every element counted once across all ranks, whatever the layout), global-norm clipping, and the
// per-layer start of the gradient reductions that overlaps them with the rest of backward. Dense gradients reduce
// over DP×CP, expert gradients over EDP (their other contributions arrived through the dispatcher); under
// sequence parallelism replicated-over-TP gradients are first summed over TP. The learning rate is the caller's.
// Each class is updated by AdamW or SGD (replicated, or sharded: distributed_optimizer.h, optionally as K
// instances), or with --optimizer muon by Muon for its matrices (muon.h) beside AdamW for the rest; with
// --decoupled-lr the embedding and output layer form a class of their own at that rate.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "moecore/comm/process_group.h"
#include "moecore/optim/grad_scaler.h"
#include "moecore/optim/grad_sync.h"
#include "moecore/optim/muon.h"
#include "moecore/optim/optimizer.h"
#include "moecore/optim/sgd.h"

namespace moecore::optim {

struct OptimizerGroups {
  // All null for a single process. dp: DP×CP (dense gradients); edp: expert data parallel; tp: tensor parallel
  // (sequence-parallel sums); world: every rank (the norm).
  const comm::ProcessGroup *dp = nullptr, *edp = nullptr, *tp = nullptr, *world = nullptr;
  const comm::ProcessGroup* etp = nullptr;  // expert tensor parallel (Muon assembles expert matrices over it)
  // Pipeline parallelism: Megatron's embedding group (first and last stage) and the word embedding this rank holds
  // in it (the first stage's, or the tied output layer's copy on the last stage). Its gradient is summed over the
  // group before the last bucket's reduction, and each copy counts 1/|group| in the norm.
  const comm::ProcessGroup* embedding = nullptr;
  const nn::Parameter* shared_embedding = nullptr;
};

struct OptimizerConfig {
  kernels::AdamWParams adam;  // lr is set per step
  double clip_grad = 1.0;     // global-norm clip (0: off)
  bool distributed = false;   // --use-distributed-optimizer: shard master weights and moments
  ElementRule rule;           // --optimizer adam or sgd (and the elementwise rule beside Muon: AdamW)
  bool muon = false;          // --optimizer muon / dist_muon: Muon for the 2-D weights (is_muon_matrix)
  MuonConfig muon_cfg;        // (with `distributed`: Megatron's layer-wise distributed optimizer for them)
  int64_t instances = 1;      // --num-distributed-optimizer-instances: shard over DP/K, all-reduce over K
  bool decoupled = false;     // --decoupled-lr: the embedding and output layer in parts of their own
  bool count_zeros = false;   // --log-num-zeros-in-grad: count the gradients' zeros (a pass over them) every step
  int64_t bucket_size = 0;    // --ddp-bucket-size in elements (0: one gradient bucket per layer; grad_buffer.h)
  // --check-for-nan-in-loss-and-grad (Megatron's default): a step whose gradient norm is not finite is not applied
  // (on a GPU the update kernels read the skip flag; the flag stays set, so no later step is applied either).
  bool check_finite = false;
  int64_t deferred_norms = 64;  // how many steps' norms a GPU keeps in device memory until read (take_norms)
  // --overlap-grad-reduce: each bucket's reduction starts as soon as it is final in the last micro-batch's backward
  // (layer_grads_final); without it every reduction starts after backward, in finish_gradients (Megatron's
  // finish_grad_sync). The same buckets and the same collectives either way.
  bool overlap_grad_reduce = false;
  // --overlap-param-gather (distributed optimizer): the step leaves the parameter all-gathers in flight, each
  // waited in the next forward before the first layer that reads its bucket (wait_param_gather);
  // param_gather_with_step (--overlap-param-gather-with-optimizer-step): all dispatched in the step itself.
  bool overlap_param_gather = false, param_gather_with_step = false;
  // Loss scaling (grad_scaler.h): --loss-scale, or the dynamic scaler of --fp16. The gradients are unscaled as they
  // are reduced, and a step with an inf or NaN among them is skipped (no update) and the scaler updated. CPU only.
  GradScalerConfig scaler;
  // Megatron FSDP (--use-megatron-fsdp): what `distributed` shards (optimizer.h; no_shard: the replicated optimizer,
  // as without `distributed`), and --fsdp-double-buffer.
  Sharding sharding = Sharding::Optim;
  bool fsdp_double_buffer = false;
  // --init-model-with-meta-device under optim_grads_params: the parameters arrive unallocated and each rank
  // initialises its shards from init_seed (ParamRegistry::set_meta).
  bool fsdp_init_shards = false;
  uint64_t init_seed = 0;
  bool fsdp_outer_shard = false;  // --outer-dp-sharding-strategy optim with K instances (distributed_optimizer.h)
  // Megatron's fp16/bf16 main gradients (low_precision_grads.h): rounded to grad_precision.main after each
  // micro-batch (micro_batch_grads_done), reduced in grad_precision.comm. CPU only.
  GradPrecision grad_precision;
};

class ChainedOptimizer {
 public:
  // `params`: every parameter, in registry order (the order of the moment lists); `bucket_of` maps a parameter to
  // one of `num_buckets` layer buckets (its layer; the last for the embedding, final norm and output layer).
  // Where gradients cross ranks they become views into the optimizers' gradient buckets (grad_buffer.h); the
  // parameters marked bf16_storage are held in bf16 by the model from here on, their f32 masters in the optimizers.
  ChainedOptimizer(const std::vector<nn::Parameter*>& params, size_t num_buckets, const BucketOf& bucket_of,
                   const OptimizerGroups& groups, const OptimizerConfig& cfg);
  ~ChainedOptimizer();

  // Whether gradients cross ranks: then the last micro-batch's backward reports each bucket to layer_grads_final.
  bool reduces_gradients() const { return g_.dp != nullptr; }
  // Layer bucket `bucket`'s gradients are final: the tied embedding's and the sequence-parallel sums, and with
  // overlap_grad_reduce the start of the data-parallel reductions it completes.
  void layer_grads_final(size_t bucket);
  // A micro-batch's backward wrote layer bucket `bucket`'s gradients (every micro-batch, before layer_grads_final):
  // with low-precision main gradients they are rounded to their dtype here, Megatron's accumulation into an
  // fp16/bf16 main_grad (not under Megatron FSDP's units, which accumulate the reduced shard). Nothing otherwise.
  void micro_batch_grads_done(size_t bucket);
  bool rounds_grads() const { return cfg_.grad_precision.main != DType::F32 && !fsdp_units(); }
  // With overlap_param_gather: the forward is about to read layer bucket `bucket` (Megatron's forward pre-hook):
  // waits for the all-gathers of the parameter buckets holding it (dispatching the next ones). Nothing otherwise.
  void wait_param_gather(size_t bucket);
  // Megatron FSDP's unit hooks (optim_grads and up; optimizer.h), called by the model for layer bucket `bucket`:
  // its parameters are read now (gathered), will be read next (their gather posted), not read for now (freed), its
  // backward starts (parameters gathered, whole gradients taken) or ends in this micro-batch (the tied embedding's
  // and sequence-parallel sums, then the reduce-scatter into the owned shards).
  bool fsdp_units() const { return distributed() && (cfg_.sharding == Sharding::OptimGrads || params_sharded()); }
  bool params_sharded() const { return distributed() && cfg_.sharding == Sharding::OptimGradsParams; }
  void unit_forward(size_t bucket);
  void unit_prefetch(size_t bucket);
  void unit_params_done(size_t bucket);
  void unit_backward(size_t bucket);
  void unit_backward_done(size_t bucket);
  // What the units hold now, over the parts (ParamClassOptimizer::buckets_gathered, grad_buckets_live).
  size_t buckets_gathered() const;
  size_t grad_buckets_live() const;
  // Every parameter all-gather still in flight completed (before anything but the forward reads the parameters:
  // a checkpoint, the parameter norm, the weight hashes).
  void finish_param_gather();
  // What overlapped in the last step (the overlap tests' evidence): the gradient reductions started during
  // backward (layer_grads_final) rather than in finish_gradients, and the parameter buckets whose all-gather the
  // step left in flight for the next forward (until that forward, or finish_param_gather, completes them).
  size_t reductions_started_in_backward() const { return started_in_backward_; }
  size_t param_gathers_pending() const;
  // Finishes every reduction and computes the global gradient norm (before clipping) of step `iteration`, the
  // clip coefficient and the non-finite check where the gradients live. With a loss scaler the gradients are
  // unscaled first, an inf or NaN among them on any rank (the norm summed over the world is then not finite: every
  // rank sees it) marks the step skipped (skipped()), and the scaler is updated, as Megatron's prepare_grads. Returns
  // the norm where it reached the host anyway: on the CPU, or with several ranks (their sum went through the host, with
  // `riders`: the trainer's run control, train/stop_riders.h, summed in the same collective at no extra round). On one
  // GPU nothing is read back: nullopt, and the norm waits in device memory for take_norms.
  std::optional<double> finish_gradients(std::span<double> riders, int64_t iteration);
  // The norms finish_gradients left on the device, in step order, and the first of those steps whose norm was not
  // finite with check_finite (0: none); one read-back. Call before deferred_full() would be true after another step.
  kernels::DeferredNorms take_norms() { return kernels::take_deferred_norms(clip_); }
  bool deferred_full() const { return clip_.pending >= clip_.capacity(); }
  // The zero entries of the gradients the last finish_gradients reduced (with cfg.count_zeros; else 0), every element
  // counted once over all ranks (Megatron's --log-num-zeros-in-grad; summed in the same collective as the norm).
  int64_t num_zeros_in_grad() const { return num_zeros_; }
  // Clipping by the last finish_gradients' norm (applied as AdamW reads each gradient; on a GPU the coefficient is
  // read from device memory) and one AdamW update at learning rate `lr`, none where the check found the norm not
  // finite. `decoupled_lr` (≥ 0, with OptimizerConfig::decoupled): the embedding's and output layer's rate.
  // With a loss scaler, a step finish_gradients found an inf or NaN in does nothing: no update, no moment changes.
  // `iteration`: Adam's step count, the updates applied so far including this one (Megatron's per-parameter step,
  // which a skipped step does not advance).
  void step(double lr, int64_t iteration, double decoupled_lr = -1);
  // The loss scale the next backward multiplies the loss by (1 without a scaler), and whether the last
  // finish_gradients found an inf or NaN under a scaler (the step it finished is skipped).
  float loss_scale() const { return scaler_.scale(); }
  bool skipped() const { return found_inf_; }
  const GradScaler& grad_scaler() const { return scaler_; }
  GradScaler& grad_scaler() { return scaler_; }
  // The weight decay of the next steps (the scheduler's, Megatron's get_wd; norms and biases still take none).
  void set_weight_decay(double wd) { cfg_.adam.weight_decay = wd; }

  // Adam moments of every parameter, whole, in `params` order (collective under the distributed optimizer), and
  // back.
  void gather_moments(std::vector<Tensor>& m, std::vector<Tensor>& v) const;
  void load_moments(const std::vector<Tensor>& m, const std::vector<Tensor>& v);
  // The f32 weights of every parameter, whole, on the host, in `params` order: the masters of the parameters the
  // model stores in bf16 (gathered from their owners under the distributed optimizer: collective), the values of
  // the rest. And back: masters and model values set from whole f32 weights (a checkpoint's).
  void gather_master(std::vector<Tensor>& w) const;
  void load_master(const std::vector<Tensor>& w);
  // Σ weight(p)·‖p's f32 weights‖² over this rank's share, in `params` order (ParamClassOptimizer::master_squares):
  // summed over the world, the squared norm of the masters (--log-params-norm).
  double master_sum_squares(const std::function<double(const nn::Parameter&)>& weight) const;
  bool distributed() const { return cfg_.distributed && g_.dp; }
  // What this rank holds of the parameters' values between steps (ParamClassOptimizer::held_values), over the parts.
  std::vector<HeldValues> held_values() const;

 private:
  // Share of a parameter's squared gradient this rank adds to the global norm: 1 over the number of ranks holding
  // the same (reduced) gradient, so the sum over all ranks counts every element once.
  double norm_weight(const nn::Parameter& p) const;
  // Whether layer bucket `bucket` holds the word embedding shared by the first and last pipeline stage; its sums
  // over that group and, under sequence parallelism, over TP before the data-parallel reduction.
  bool shares_embedding(size_t bucket) const;
  void sum_shared_grads(size_t bucket);
  std::vector<nn::Parameter*> params_;
  std::map<const nn::Parameter*, size_t> index_;        // position in params_
  std::vector<std::vector<nn::Parameter*>> by_bucket_;  // params_ by layer bucket (micro_batch_grads_done)
  OptimizerGroups g_;
  int64_t num_zeros_ = 0;
  GradScaler scaler_;
  bool found_inf_ = false;
  size_t started_in_backward_ = 0, started_count_ = 0;  // the last step's, and this step's so far
  OptimizerConfig cfg_;
  kernels::ClipState clip_;  // on the parameters' device
  double dp_size_;
  size_t num_buckets_;
  SequenceParallelGrads sp_;
  std::vector<std::unique_ptr<ParamClassOptimizer>> parts_;  // dense, then expert (if any)
  std::vector<bool> decoupled_part_;                         // per part: at the decoupled learning rate
  // With K optimizer instances: per class (dense, expert) the intra-instance group (DP/K consecutive ranks of the
  // class's data-parallel group) and the inter-instance group (the K ranks at the same place in each instance).
  std::vector<std::unique_ptr<comm::ProcessGroup>> instance_groups_;
};

}  // namespace moecore::optim
