// Megatron's distributed optimizer (ZeRO-1) for one parameter class: the parameters are laid end to end in a flat
// buffer (padded to a multiple of the group size), gradients are reduce-scattered so each rank owns the sum for
// its contiguous shard, AdamW updates that shard of fp32 master weights and moments, and the updated shard is
// all-gathered back into every rank's parameters. Dense parameters shard over DP×CP, expert shards over EDP.
#pragma once

#include <functional>
#include <vector>

#include "moecore/comm/process_group.h"
#include "moecore/kernels/cpu/adamw.h"
#include "moecore/nn/parameter.h"

namespace moecore::optim {

class ShardedAdamW {
 public:
  // `norm_weight(p)`: the weight of p's elements in the returned sum of squares (1 over the number of ranks outside
  // this group holding the same shard, e.g. 1/TP for parameters replicated over tensor parallelism).
  ShardedAdamW(std::vector<nn::Parameter*> params, const comm::ProcessGroup& group,
               const std::function<double(const nn::Parameter&)>& norm_weight = {});
  // Reduce-scatters the gradients (sum) and scales the owned shard by `scale` (1/DP). Returns the weighted sum of
  // squares of the owned shard, so the caller can form one global norm.
  double reduce_gradients(double scale);
  void scale_gradients(double s);  // clipping
  // AdamW on the owned shard (per-parameter weight decay), then all-gather of the updated parameters.
  void step(const kernels::AdamWParams& hp, int64_t step);

 private:
  struct Segment {
    nn::Parameter* p;
    int64_t offset;  // in the flat buffer
    double norm_weight;
  };
  std::vector<Segment> segs_;
  const comm::ProcessGroup& group_;
  int64_t total_ = 0, shard_ = 0;
  Tensor flat_grad_, grad_shard_, master_shard_, m_, v_, flat_param_;
};

}  // namespace moecore::optim
