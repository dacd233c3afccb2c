// Gradient reduction for replicated (non-sharded) optimizer state: flat per-layer buckets all-reduced over the
// data-parallel group as soon as their layer's gradients are final, and the sum over tensor parallelism of the
// partial gradients that sequence parallelism leaves in replicated-over-TP parameters (norms, router; Megatron's
// sequence-parallel gradient all-reduce). The sharded path reduce-scatters its own buckets
// (distributed_optimizer.h); the norm and clipping are the ChainedOptimizer's.
#pragma once

#include <functional>
#include <vector>

#include "moecore/comm/process_group.h"
#include "moecore/nn/parameter.h"

namespace moecore::optim {

// Maps a parameter to its bucket (its transformer layer; the embedding, final norm and output layer share the last).
using BucketOf = std::function<size_t(const nn::Parameter&)>;

class GradBuckets {
 public:
  // `group` null: gradients stay local (start and finish do nothing).
  GradBuckets(const std::vector<nn::Parameter*>& params, size_t num_buckets, const BucketOf& bucket_of,
              const comm::ProcessGroup* group);
  // Packs bucket b and starts its all-reduce (non-blocking). Every rank starts the buckets in the same order.
  void start(size_t b);
  // Waits for every bucket, scales the sums by `scale` (1/DP) and writes them back into the gradients.
  void finish(double scale);

 private:
  struct Bucket {
    std::vector<nn::Parameter*> params;
    Tensor flat;
    comm::Work work;
  };
  std::vector<Bucket> buckets_;
  const comm::ProcessGroup* group_;
};

class SequenceParallelGrads {
 public:
  // The replicated-over-TP parameters of `params` (neither tensor- nor expert-parallel), by bucket; nothing when
  // `tp` is null.
  SequenceParallelGrads(const std::vector<nn::Parameter*>& params, size_t num_buckets, const BucketOf& bucket_of,
                        const comm::ProcessGroup* tp);
  // Sums bucket b's partial gradients over TP (blocking).
  void sum(size_t b);

 private:
  std::vector<std::vector<nn::Parameter*>> by_bucket_;
  const comm::ProcessGroup* tp_;
  Tensor flat_;  // scratch for the largest bucket
};

}  // namespace moecore::optim
