// Megatron's distributed optimizer (ZeRO-1) for one parameter class: the parameters are laid end to end in flat
// buckets (one per transformer layer, padded to a multiple of the group size), each bucket's gradients are
// reduce-scattered as soon as the bucket is final so each rank owns the sum for its contiguous share of every
// bucket, AdamW updates that share of fp32 master weights and moments, and the updated shares are all-gathered back
// into every rank's parameters. Dense parameters shard over DP×CP, expert shards over EDP.
#pragma once

#include <functional>
#include <vector>

#include "moecore/comm/process_group.h"
#include "moecore/kernels/adamw.h"
#include "moecore/nn/parameter.h"
#include "moecore/optim/optimizer.h"
#include "moecore/optim/sgd.h"

namespace moecore::optim {

class ShardedAdamW : public ParamClassOptimizer {
 public:
  // `norm_weight(p)`: the weight of p's elements in the returned sum of squares (1 over the number of ranks outside
  // this group holding the same shard, e.g. 1/TP for parameters replicated over tensor parallelism).
  // `bucket_of(p)`: p's bucket (buckets are reduced in the order start_bucket is called; default: one bucket).
  // `inter`: with --num-distributed-optimizer-instances K > 1, `group` is one instance (DP/K ranks) and `inter`
  // the K ranks holding the same shard in the other instances: the reduce-scattered shard is all-reduced over it.
  ShardedAdamW(std::vector<nn::Parameter*> params, const comm::ProcessGroup& group,
               const std::function<double(const nn::Parameter&)>& norm_weight = {},
               const std::function<size_t(const nn::Parameter&)>& bucket_of = {}, ElementRule rule = {},
               const comm::ProcessGroup* inter = nullptr);
  // Copies bucket b's gradients and starts their reduce-scatter (non-blocking). Every rank starts the buckets in
  // the same order; an unknown or empty bucket is ignored.
  void start_bucket(size_t b) override;
  // Starts the buckets not started yet, waits for all, scales the owned shard by `scale` (1/DP). Returns the
  // weighted sum of squares of the owned shard, so the caller can form one global norm.
  double reduce_gradients(double scale) override;
  double zero_share() const override;
  // The parameters, in construction order (the order of the state lists below).
  const std::vector<nn::Parameter*>& params() const override { return params_; }
  // Checkpoints: the Adam moments of every parameter, whole (each the shape of its parameter), gathered from the
  // owners (collective over the group); and back, each rank keeping its share, the fp32 master share re-read
  // from the parameters (which the caller has loaded). Whole per-parameter moments reshard across any DP size.
  void gather_moments(std::vector<Tensor>& m, std::vector<Tensor>& v) const override;
  void load_moments(const std::vector<Tensor>& m, const std::vector<Tensor>& v) override;
  // Re-reads the owned fp32 master share from the parameters (after they were loaded).
  void refresh_master() override;
  // AdamW on the owned shard (per-parameter weight decay), then all-gather of the updated parameters.
  void step(const kernels::AdamWParams& hp, int64_t step) override;

 private:
  struct Segment {
    nn::Parameter* p;
    int64_t offset;  // in its bucket's flat buffer
    double norm_weight;
  };
  struct Bucket {
    std::vector<Segment> segs;
    std::vector<nn::Parameter*> params;  // the segments' parameters, in order (laid end to end from offset 0)
    int64_t size = 0, shard = 0;         // padded size = shard · group size
    int64_t local = 0;                   // offset of this bucket's share in the owned arrays
    Tensor flat_grad, flat_param;
    comm::Work work;
    bool started = false;
  };
  // Runs fn(segment, owned range [a, b) in the bucket's flat coordinates) for every segment overlapping the share.
  template <typename Fn>
  void for_owned(const Bucket& bk, Fn fn) const;
  std::vector<Bucket> buckets_;
  std::vector<nn::Parameter*> params_;
  const comm::ProcessGroup& group_;
  ElementRule rule_;
  const comm::ProcessGroup* inter_;
  Tensor grad_shard_, master_shard_, m_, v_;
};

}  // namespace moecore::optim
