// Megatron's distributed optimizer (ZeRO-1) for one parameter class: the parameters' gradients and values are views
// into contiguous buckets (grad_buffer.h, padded to a multiple of the group size), each bucket's gradients are
// reduce-scattered in place as soon as the bucket is final so each rank's region holds the sum for its share,
// AdamW updates that share of the fp32 master weights and moments, and the updated shares are all-gathered in place
// into the parameter buffer the model's values are views of (bf16 for the parameters stored in bf16, whose fp32
// master lives only here, sharded). Dense parameters shard over DP×CP, expert shards over EDP.
#pragma once

#include <functional>
#include <vector>

#include "moecore/comm/process_group.h"
#include "moecore/kernels/adamw_update.h"
#include "moecore/nn/parameter.h"
#include "moecore/optim/grad_buffer.h"
#include "moecore/optim/optimizer.h"
#include "moecore/optim/sgd.h"

namespace moecore::optim {

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
               int64_t bucket_size = 0);
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

 private:
  struct Segment {
    nn::Parameter* p;
    int64_t offset;  // in its bucket
    double norm_weight;
  };
  struct Bucket {
    BufferBucket buf;
    std::vector<Segment> segs;
    int64_t shard = 0;            // buf.padded = shard · group size
    int64_t local = 0;            // offset of this bucket's share in the owned moment arrays
    int64_t master = 0;           // offset of its share in master_ (bf16-stored buckets)
    comm::Work gather;            // its parameter all-gather, while in flight
    bool gather_pending = false;  // updated by the step, not yet gathered into every rank's parameters
  };
  // Runs fn(segment, offset in the owned arrays, length, offset in the bucket) for every segment overlapping the
  // share.
  template <typename Fn>
  void for_owned(const Bucket& bk, Fn fn) const;
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

}  // namespace moecore::optim
