// Gradient reduction for replicated (non-sharded) optimizer state: contiguous gradient buckets all-reduced in place
// over the data-parallel group as soon as their gradients are final, and the sum over tensor parallelism of the
// partial gradients that sequence parallelism leaves in replicated-over-TP parameters (norms, router; Megatron's
// sequence-parallel gradient all-reduce). The sharded path reduce-scatters its own buckets
// (distributed_optimizer.h); the norm and clipping are the ChainedOptimizer's.
#pragma once

#include <functional>
#include <vector>

#include "moecore/comm/process_group.h"
#include "moecore/nn/parameter.h"
#include "moecore/optim/grad_buffer.h"
#include "moecore/optim/low_precision_grads.h"

namespace moecore::optim {

class GradBuckets {
 public:
  // `group` null: gradients stay local (start and finish do nothing). Otherwise the gradients become views into
  // contiguous buckets (grad_buffer.h; `bucket_size`: --ddp-bucket-size, 0 for one bucket per layer bucket).
  // With low-precision main gradients (`precision`, low_precision_grads.h) each bucket is reduced in its comm
  // dtype, pre-scaled by `scale` (1/DP) as Megatron's, and rounded to its main dtype; finish's scale then does
  // nothing more.
  GradBuckets(const std::vector<nn::Parameter*>& params, size_t num_buckets, const BucketOf& bucket_of,
              const comm::ProcessGroup* group, int64_t bucket_size = 0, GradPrecision precision = {},
              double scale = 1.0);
  // Layer bucket b's gradients are final: starts the all-reduce (in place, non-blocking) of every bucket that
  // completes (returns how many). Every rank reports the layers in the same order.
  size_t start(size_t b);
  // Starts what was not started, waits for every bucket and scales the sums by `scale` (1/DP), in place.
  void finish(double scale);

 private:
  void reduce(BufferBucket& bk);  // starts (or, in low precision, does) bucket bk's all-reduce
  std::vector<BufferBucket> buckets_;
  const comm::ProcessGroup* group_;
  GradPrecision precision_;
  double scale_;
};

class SequenceParallelGrads {
 public:
  // The replicated-over-TP parameters of `params` (neither tensor- nor expert-parallel), by bucket; nothing when
  // `tp` is null.
  // `main`: the main gradients' dtype (low_precision_grads.h): the sums are then taken in it, as Megatron's
  // all-reduce of its fp16/bf16 main_grad.
  SequenceParallelGrads(const std::vector<nn::Parameter*>& params, size_t num_buckets, const BucketOf& bucket_of,
                        const comm::ProcessGroup* tp, DType main = DType::F32);
  // Sums bucket b's partial gradients over TP (blocking).
  void sum(size_t b);

 private:
  std::vector<std::vector<nn::Parameter*>> by_bucket_;
  const comm::ProcessGroup* tp_;
  DType main_;
  Tensor flat_;  // scratch for the largest bucket
};

}  // namespace moecore::optim
