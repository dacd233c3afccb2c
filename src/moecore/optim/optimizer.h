// The interface of an optimizer for one class of parameters (dense, or expert) and the group its gradients are
// reduced over: the ChainedOptimizer drives one per class through it, whether the state is replicated (AdamW with
// all-reduced buckets) or sharded (ShardedAdamW, Megatron's distributed optimizer).
#pragma once

#include <functional>
#include <vector>

#include "moecore/kernels/adamw_update.h"
#include "moecore/kernels/grad_clip.h"
#include "moecore/nn/parameter.h"

namespace moecore::optim {

// What data parallelism shards (Megatron FSDP's --data-parallel-sharding-strategy; optim is Megatron's distributed
// optimizer, ZeRO-1): no_shard keeps everything whole on every rank (DDP); optim shards the fp32 master weights and
// Adam moments; optim_grads (ZeRO-2) also keeps only the owned gradient shard between a unit's backwards, each
// unit's (transformer layer's, or the embedding's, final norm's and output layer's) gradients reduce-scattered into
// it as that unit's backward ends in every micro-batch; optim_grads_params (ZeRO-3) keeps only the owned parameter
// shard too, gathering a unit's parameters before its forward and its backward and freeing them after.
enum class Sharding { NoShard, Optim, OptimGrads, OptimGradsParams };

// What a rank holds of a parameter's values between steps: elements [first, first + values.numel()) of the
// flattened parameter — all of them but under Megatron FSDP's optim_grads_params, where it holds its shard.
struct HeldValues {
  nn::Parameter* p = nullptr;
  int64_t first = 0;
  Tensor values;  // 1-D, a view
};

class ParamClassOptimizer {
 public:
  virtual ~ParamClassOptimizer() = default;
  // The parameters, in the order of the moment lists below.
  virtual const std::vector<nn::Parameter*>& params() const = 0;
  // Bucket b's gradients are final (in the last micro-batch's backward): start reducing them (non-blocking).
  // Returns how many reductions it started.
  virtual size_t start_bucket(size_t b) = 0;
  // Starts what was not started, waits for every reduction, scales the sums by `scale` (1/DP), then, where a loss
  // scale is in use, unscales them by `unscale` (an f32 multiply, as Megatron's unscale of the main gradients), and
  // adds this rank's weighted share of the squared gradient norm to `clip` as one part (kernels::squares_add_part:
  // on a GPU in device memory; shares summed over all ranks count every element once).
  virtual void reduce_gradients(double scale, float unscale, kernels::ClipState& clip) = 0;
  // After reduce_gradients: this rank's weighted share of the zero entries of the reduced gradients (shares summed
  // over all ranks count every element once; Megatron's --log-num-zeros-in-grad).
  virtual double zero_share() const = 0;
  // AdamW with per-parameter weight decay; `step` ≥ 1. The gradient scale is hp.grad_scale, or on a GPU read from
  // hp.clip (kernels::apply_clip) when host_clip() is false.
  virtual void step(const kernels::AdamWParams& hp, int64_t step) = 0;
  // Whether step needs the gradient scale on the host (an update on host copies: Muon's).
  virtual bool host_clip() const { return false; }
  // Where the step leaves parameter all-gathers in flight (the distributed optimizer with --overlap-param-gather):
  // the forward is about to read layer bucket b (wait for its buckets), and every one completed. Nothing elsewhere.
  virtual void wait_param_gather(size_t /*b*/) {}
  virtual void finish_param_gather() {}
  virtual size_t param_gathers_pending() const { return 0; }  // updated buckets not yet gathered
  // Megatron FSDP's unit hooks (optim_grads and optim_grads_params; nothing elsewhere), b a layer bucket: b's
  // parameters are read by a forward (or a recompute's replay) now (gather them), will be read next (post their
  // gather: the prefetch), are not read for now (free them), its backward starts (gather them, give them whole
  // gradients) or is done in this micro-batch (reduce-scatter the gradients into the owned shard, free both).
  // Every rank of the group calls them in the same order.
  virtual void unit_forward(size_t /*b*/) {}
  virtual void unit_prefetch(size_t /*b*/) {}
  virtual void unit_forward_done(size_t /*b*/) {}
  virtual void unit_backward(size_t /*b*/) {}
  virtual void unit_backward_done(size_t /*b*/) {}
  // The buckets whose parameters (optim_grads_params) or whole gradients (optim_grads and up) are held now: the FSDP
  // tests' evidence that units are freed.
  virtual size_t buckets_gathered() const { return 0; }
  virtual size_t grad_buckets_live() const { return 0; }
  // The Adam moments whole per parameter (collective where sharded), and back.
  virtual void gather_moments(std::vector<Tensor>& m, std::vector<Tensor>& v) const = 0;
  virtual void load_moments(const std::vector<Tensor>& m, const std::vector<Tensor>& v) = 0;
  // The f32 weights of every parameter, whole, on the host (collective where sharded): the optimizer's master
  // where it keeps one (parameters stored in bf16), else the value itself. And back: each master (or its owned
  // share) set from the whole f32 weights, and the model's values from them (rounded where stored in bf16).
  virtual void gather_master(std::vector<Tensor>& w) const = 0;
  virtual void load_master(const std::vector<Tensor>& w) = 0;
  // ‖f32 weights of p‖² per parameter, in params() order, over what this rank holds (Megatron's
  // calc_params_l2_norm reads the fp32 main parameters): a sharded master counts its share times the shard count,
  // so the sum over the ranks of the optimizer's group counts every element as often as a whole copy on each would.
  virtual std::vector<double> master_squares() const = 0;
  // The values this rank holds between steps, for checks that read them (finiteness).
  virtual std::vector<HeldValues> held_values() const {
    std::vector<HeldValues> held;
    for (nn::Parameter* p : params()) held.push_back({p, 0, p->value.reshape({p->value.numel()})});
    return held;
  }
};

}  // namespace moecore::optim
