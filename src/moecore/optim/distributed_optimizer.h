// Megatron's distributed optimizer (ZeRO-1) for one parameter class: the parameters' gradients and values are views
// into contiguous buckets (grad_buffer.h, padded to a multiple of the group size), each bucket's gradients are
// reduce-scattered in place as soon as the bucket is final so each rank's region holds the sum for its share,
// AdamW updates that share of the fp32 master weights and moments, and the updated shares are all-gathered in place
// into the parameter buffer the model's values are views of (bf16 for the parameters stored in bf16, whose fp32
// master lives only here, sharded). Dense parameters shard over DP×CP, expert shards over EDP.
// As Megatron FSDP's engine (`sharding` beyond optim; optimizer.h Sharding) it keeps less: under optim_grads only the
// owned gradient shard lives between units' backwards (a unit's whole gradients are taken as its backward starts and
// reduce-scattered into the shard as it ends, in every micro-batch; distributed_optimizer_fsdp.cpp), under
// optim_grads_params only the owned parameter shard too (a unit's parameters all-gathered before its forward and
// before its backward, the next unit's gather posted as one starts, and freed after each). One bucket per layer
// bucket and storage dtype is one FSDP unit.
#pragma once

#include <algorithm>
#include <functional>
#include <vector>

#include "moecore/comm/process_group.h"
#include "moecore/kernels/adamw_update.h"
#include "moecore/nn/parameter.h"
#include "moecore/optim/grad_buffer.h"
#include "moecore/optim/low_precision_grads.h"
#include "moecore/optim/optimizer.h"
#include "moecore/optim/sgd.h"

namespace moecore::optim {

// Megatron FSDP's options of the distributed optimizer: what it shards, --fsdp-double-buffer, and
// --init-model-with-meta-device (the parameters arrive unallocated, ParamRegistry::set_meta, and each rank
// initialises its owned shards from `seed` by parameter name and element index).
struct FsdpOptions {
  Sharding sharding = Sharding::Optim;
  bool double_buffer = false;
  bool init_shards = false;
  uint64_t seed = 0;
  // --outer-dp-sharding-strategy optim (HSDP with optim_grads_params and K instances): the optimizer state of each
  // instance's shard sharded over the K ranks holding it (the inter-instance group) too; the gradients reduce-scattered
  // over them, the updated parameters all-gathered back.
  bool outer_shard = false;
  // Low-precision main gradients (low_precision_grads.h; Megatron FSDP's main_grads_dtype and grad_comm_dtype, or
  // the distributed optimizer's fp16/bf16 gradient buffer): every reduction in `precision.comm`, pre-scaled by
  // `grad_scale` (1/DP), the owned shard held in `precision.main`.
  GradPrecision precision;
  double grad_scale = 1.0;
};

class ShardedAdamW : public ParamClassOptimizer {
 public:
  // `norm_weight(p)`: the weight of p's elements in the returned sum of squares (1 over the number of ranks outside
  // this group holding the same shard, e.g. 1/TP for parameters replicated over tensor parallelism).
  // `bucket_of(p)`: p's layer bucket (0..num_layers; default: all in one), `bucket_size`: --ddp-bucket-size
  // (grad_buffer.h). `inter`: with --num-distributed-optimizer-instances K > 1, `group` is one instance (DP/K ranks)
  // and `inter` the K ranks holding the same shard in the other instances: the reduced shard is all-reduced over it.
  // The parameters' gradients and values become views into the buckets; a parameter marked bf16_storage is held
  // in bf16 from here on, its f32 master only in this rank's shard.
  ShardedAdamW(std::vector<nn::Parameter*> params, const comm::ProcessGroup& group,
               const std::function<double(const nn::Parameter&)>& norm_weight = {}, const BucketOf& bucket_of = {},
               ElementRule rule = {}, const comm::ProcessGroup* inter = nullptr, size_t num_layers = 0,
               int64_t bucket_size = 0, const FsdpOptions& fsdp = {});
  // Layer bucket b's gradients are final: starts the in-place reduce-scatter of every bucket it completes
  // (non-blocking). Every rank reports the layers in the same order.
  size_t start_bucket(size_t b) override;
  // Starts the buckets not started yet, waits for all, scales the owned shard by `scale` (1/DP), and adds the
  // weighted sum of squares of the owned shard to `clip` (one part), so the caller can form one global norm.
  void reduce_gradients(double scale, float unscale, kernels::ClipState& clip) override;
  double zero_share() const override;
  // The parameters, in construction order (the order of the state lists below).
  const std::vector<nn::Parameter*>& params() const override { return params_; }
  // Checkpoints: the Adam moments of every parameter, whole (each the shape of its parameter), gathered from the
  // owners (collective over the group); and back, each rank keeping its share. Whole per-parameter moments reshard
  // across any DP size.
  void gather_moments(std::vector<Tensor>& m, std::vector<Tensor>& v) const override;
  void load_moments(const std::vector<Tensor>& m, const std::vector<Tensor>& v) override;
  void gather_master(std::vector<Tensor>& w) const override;
  void load_master(const std::vector<Tensor>& w) override;
  std::vector<double> master_squares() const override;
  std::vector<HeldValues> held_values() const override;
  // AdamW on the owned shard (per-parameter weight decay), then the in-place all-gather of the updated parameters
  // (with overlap_param_gather: left in flight for the next forward).
  void step(const kernels::AdamWParams& hp, int64_t step) override;
  // Megatron's --overlap-param-gather: step dispatches the all-gather of the bucket the forward reads first (with
  // `with_step`, --overlap-param-gather-with-optimizer-step: of every bucket) and returns; wait_param_gather(b),
  // called before the forward reads layer bucket b, waits for the buckets holding it and dispatches the next one in
  // the forward's order.
  void overlap_param_gather(bool with_step);
  void wait_param_gather(size_t b) override;
  void finish_param_gather() override;
  size_t param_gathers_pending() const override;
  // Megatron FSDP's units (optimizer.h; distributed_optimizer_fsdp.cpp). With `double_buffer`
  // (--fsdp-double-buffer) the gathered parameters of optim_grads_params live in two buffers kept for the run, each
  // the size of the largest unit, used in turn.
  void unit_forward(size_t b) override;
  void unit_prefetch(size_t b) override;
  void unit_forward_done(size_t b) override;
  void unit_backward(size_t b) override;
  void unit_backward_done(size_t b) override;
  size_t buckets_gathered() const override;
  size_t grad_buckets_live() const override;

 private:
  struct Segment {
    nn::Parameter* p;
    int64_t offset;  // in its bucket
    double norm_weight;
    Shape shape;  // the parameter's (its value is not held while its unit is freed)
    int64_t numel() const { return shape.numel(); }
  };
  struct Bucket {
    BufferBucket buf;
    std::vector<Segment> segs;
    int64_t shard = 0;            // buf.padded = shard · group size
    int64_t local = 0;            // offset of this bucket's share in the owned moment arrays
    int64_t master = 0;           // offset of its share in master_ (bf16-stored buckets)
    comm::Work gather;            // its parameter all-gather, while in flight
    bool gather_pending = false;  // updated by the step, not yet gathered into every rank's parameters
    // The owned shards: the gradient sum [shard] (f32) and the parameters [shard] (storage dtype); views into
    // buf.grad and buf.param where those live for the run.
    Tensor grad_shard, param_shard;
    bool grads_live = true;  // buf.grad holds the whole gradients (always, below optim_grads)
    bool reducing = false;   // optim_grads+: buf.grad's reduce-scatter in flight (buf.work)
    bool summed = false;     // optim_grads+: grad_shard holds this step's sum so far
    bool resident = true;    // buf.param holds the whole parameters (always, below optim_grads_params)
    bool gathering = false;  // optim_grads_params: the all-gather into buf.param in flight (gather)
    int slot = -1;           // with the double buffer: the one buf.param is a view of
    // FP8 parameters (buf.fp8): the FP8 bytes of the owned shard (packed four to an i32 word) and, while a unit
    // gathers them, every rank's.
    Tensor codes, codes_all;
  };
  // Whether the bucket's f32 masters live in master_ (bf16-stored and FP8 parameters) rather than in its values.
  static bool has_master(const Bucket& bk) { return is_half(bk.buf.storage) || bk.buf.fp8; }
  // --fp8-param-gather (distributed_optimizer_fp8.cpp): every FP8 bucket's owned masters cast to FP8 with the
  // whole tensors' scales (amaxes reduced over the group), the codes kept and the owned values set to them; the
  // codes all-gathered (one byte per element) and read back into the whole parameters; the bytes of all ranks'
  // shards in bk.codes_all read back into buf.param.
  void cast_fp8();
  void gather_fp8(Bucket& bk);
  void decode_gathered(Bucket& bk);
  // Megatron FSDP (distributed_optimizer_fsdp.cpp): the buckets of layer bucket b; whole gradients bound to the
  // parameters; the reduce-scatter of whole gradients started, and finished into the owned shard; the parameters
  // gathered (async: posted, waited on first read) and freed.
  void shard_units();  // at construction, optim_grads and up: only the owned shards stay
  std::vector<size_t> unit_buckets(size_t b) const;
  void take_grads(Bucket& bk);
  void start_grad_reduce(Bucket& bk);
  void finish_grad_reduce(Bucket& bk);
  void post_gather(Bucket& bk, bool prefetch = false);  // a prefetch skips where both double buffers are taken
  void wait_gathered(Bucket& bk);
  void free_params(Bucket& bk);
  void free_all_units();  // before the step: nothing gathered, every reduction in the owned shards
  Sharding sharding_ = Sharding::Optim;
  GradPrecision precision_;
  double grad_scale_ = 1.0;
  bool double_buffer_ = false, init_shards_ = false, outer_ = false;
  uint64_t seed_ = 0;
  std::vector<Tensor> slots_;  // the double buffer's two, per storage dtype: [dtype index · 2 + k]
  int next_slot_ = 0;
  bool grads_sharded() const { return sharding_ == Sharding::OptimGrads || sharding_ == Sharding::OptimGradsParams; }
  bool params_sharded() const { return sharding_ == Sharding::OptimGradsParams; }
  int64_t lo(const Bucket& bk) const { return group_.rank() * bk.shard; }
  // The range of the bucket whose optimizer state this rank owns: its shard, or with outer_ its part of it.
  int64_t state_len(const Bucket& bk) const { return outer_ ? bk.shard / inter_->size() : bk.shard; }
  int64_t state_lo(const Bucket& bk) const { return lo(bk) + (outer_ ? inter_->rank() * state_len(bk) : 0); }
  // Runs fn(segment, offset in the owned arrays, length, offset in the bucket) for every segment overlapping the
  // share.
  template <typename Fn>
  void for_owned(const Bucket& bk, Fn fn) const;
  // fn(segment, offset in [first, first + len), length, offset in the bucket) for every segment overlapping it.
  template <typename Fn>
  void for_range(const Bucket& bk, int64_t first, int64_t len, Fn fn) const;
  // A bucket's whole [padded] values on the host from every rank's part of an owned state array.
  Tensor gather_state(const Bucket& bk, const Tensor& part) const;
  void start(Bucket& bk);
  // The bucket's parameter all-gather dispatched (non-blocking) if not yet.
  void dispatch_gather(Bucket& bk);
  std::vector<Bucket> buckets_;
  // With --overlap-param-gather: the buckets in the order the forward first reads them (the embedding's layer
  // bucket first, then by layer), and whether the step dispatches them all.
  bool overlap_gather_ = false, gather_with_step_ = false;
  std::vector<size_t> gather_order_;
  size_t num_layers_ = 0;
  std::vector<nn::Parameter*> params_;
  const comm::ProcessGroup& group_;
  ElementRule rule_;
  const comm::ProcessGroup* inter_;
  // The owned shards: the Adam moments of every bucket, the f32 master weights of the bf16-stored buckets (an f32
  // parameter's own shard in its parameter buffer is its master).
  Tensor master_, m_, v_;
  std::vector<Tensor> norm_terms_;  // the owned gradient slices and their weights in the norm, reused every step
  std::vector<double> norm_weights_;
};

// Defined here for every file of the optimizer (distributed_optimizer*.cpp).
template <typename Fn>
void ShardedAdamW::for_range(const Bucket& bk, int64_t first, int64_t len, Fn fn) const {
  for (const auto& s : bk.segs) {
    const int64_t a = std::max(first, s.offset), b = std::min(first + len, s.offset + s.numel());
    if (a < b) fn(s, a - first, b - a, a);
  }
}

template <typename Fn>
void ShardedAdamW::for_owned(const Bucket& bk, Fn fn) const {
  for_range(bk, state_lo(bk), state_len(bk), [&](const Segment& s, int64_t rel, int64_t len, int64_t at) {
    fn(s, rel + bk.local, len, at);  // owned-array offset, length, offset in the bucket
  });
}

}  // namespace moecore::optim
