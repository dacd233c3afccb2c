// Megatron's ChainedOptimizer: the dense and the expert optimizer behind one interface, one global gradient norm
// over both (every element counted once across all ranks, whatever the layout), global-norm clipping, and the
// per-layer start of the gradient reductions that overlaps them with the rest of backward. Dense gradients reduce
// over DP×CP, expert gradients over EDP (their other contributions arrived through the dispatcher); under
// sequence parallelism replicated-over-TP gradients are first summed over TP. The learning rate is the caller's.
#pragma once

#include <map>
#include <memory>
#include <vector>

#include "moecore/comm/process_group.h"
#include "moecore/optim/grad_sync.h"
#include "moecore/optim/optimizer.h"

namespace moecore::optim {

struct OptimizerGroups {
  // All null for a single process. dp: DP×CP (dense gradients); edp: expert data parallel; tp: tensor parallel
  // (sequence-parallel sums); world: every rank (the norm).
  const comm::ProcessGroup *dp = nullptr, *edp = nullptr, *tp = nullptr, *world = nullptr;
};

struct OptimizerConfig {
  kernels::AdamWParams adam;  // lr is set per step
  double clip_grad = 1.0;     // global-norm clip (0: off)
  bool distributed = false;   // --use-distributed-optimizer: shard master weights and moments
};

class ChainedOptimizer {
 public:
  // `params`: every parameter, in registry order (the order of the moment lists); `bucket_of` maps a parameter to
  // one of `num_buckets` buckets (its layer; the last for the embedding, final norm and output layer).
  ChainedOptimizer(const std::vector<nn::Parameter*>& params, size_t num_buckets, const BucketOf& bucket_of,
                   const OptimizerGroups& groups, const OptimizerConfig& cfg);
  ~ChainedOptimizer();

  // Whether gradients cross ranks: then the last micro-batch's backward reports each bucket to layer_grads_final.
  bool reduces_gradients() const { return g_.dp != nullptr; }
  void layer_grads_final(size_t bucket);
  // Finishes every reduction and returns the global gradient norm (before clipping). `riders` are summed over all
  // ranks in the same collective (a stop request, say), so they cost no extra round.
  double finish_gradients(std::vector<double>& riders);
  // Clipping by `grad_norm` (applied as AdamW reads each gradient) and one AdamW update at learning rate `lr`.
  void step(double lr, double grad_norm, int64_t iteration);
  // The weight decay of the next steps (the scheduler's, Megatron's get_wd; norms and biases still take none).
  void set_weight_decay(double wd) { cfg_.adam.weight_decay = wd; }

  // Adam moments of every parameter, whole, in `params` order (collective under the distributed optimizer), and
  // back; refresh_master re-reads sharded master weights after the parameters were loaded.
  void gather_moments(std::vector<Tensor>& m, std::vector<Tensor>& v) const;
  void load_moments(const std::vector<Tensor>& m, const std::vector<Tensor>& v);
  void refresh_master();
  bool distributed() const { return cfg_.distributed && g_.dp; }

 private:
  // Share of a parameter's squared gradient this rank adds to the global norm: 1 over the number of ranks holding
  // the same (reduced) gradient, so the sum over all ranks counts every element once.
  double norm_weight(const nn::Parameter& p) const;
  std::vector<nn::Parameter*> params_;
  std::map<const nn::Parameter*, size_t> index_;  // position in params_
  OptimizerGroups g_;
  OptimizerConfig cfg_;
  double dp_size_;
  SequenceParallelGrads sp_;
  std::vector<std::unique_ptr<ParamClassOptimizer>> parts_;  // dense, then expert (if any)
};

}  // namespace moecore::optim
