// Gradient buckets and sequence-parallel sums (see grad_sync.h).
#include "moecore/optim/grad_sync.h"

#include <algorithm>

#include "moecore/kernels/elementwise.h"

namespace moecore::optim {

namespace {
int64_t numel_of(const std::vector<nn::Parameter*>& ps) {
  int64_t n = 0;
  for (auto* p : ps) n += p->grad.numel();
  return n;
}
}  // namespace

GradBuckets::GradBuckets(const std::vector<nn::Parameter*>& params, size_t num_buckets, const BucketOf& bucket_of,
                         const comm::ProcessGroup* group)
    : group_(group) {
  if (!group_) return;
  buckets_.resize(num_buckets);
  for (auto* p : params) {
    const size_t b = bucket_of(*p);
    MOE_ASSERT(b < num_buckets);
    buckets_[b].params.push_back(p);
  }
  for (auto& bk : buckets_) bk.flat = Tensor::empty({numel_of(bk.params)}, DType::F32);
}

void GradBuckets::start(size_t b) {
  if (!group_) return;
  Bucket& bk = buckets_.at(b);
  if (bk.params.empty()) return;
  nn::pack_grads(bk.params, bk.flat);
  bk.work = group_->all_reduce(bk.flat, comm::ReduceOp::Sum, /*async=*/true);
}

void GradBuckets::finish(double scale) {
  for (auto& bk : buckets_) {
    if (bk.params.empty()) continue;
    bk.work.wait();
    kernels::scale_(bk.flat, scale);
    nn::unpack_grads(bk.flat, bk.params);
  }
}

SequenceParallelGrads::SequenceParallelGrads(const std::vector<nn::Parameter*>& params, size_t num_buckets,
                                             const BucketOf& bucket_of, const comm::ProcessGroup* tp)
    : by_bucket_(num_buckets), tp_(tp) {
  if (!tp_) return;
  int64_t largest = 0;
  for (auto* p : params)
    if (!p->tensor_parallel && !p->expert_parallel) by_bucket_.at(bucket_of(*p)).push_back(p);
  for (const auto& ps : by_bucket_) largest = std::max(largest, numel_of(ps));
  flat_ = Tensor::empty({largest}, DType::F32);
}

void SequenceParallelGrads::sum(size_t b) {
  if (!tp_ || by_bucket_.at(b).empty()) return;
  const auto& ps = by_bucket_[b];
  Tensor flat = flat_.slice(0, numel_of(ps));
  nn::pack_grads(ps, flat);
  tp_->all_reduce(flat);
  nn::unpack_grads(flat, ps);
}

}  // namespace moecore::optim
