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
                         const comm::ProcessGroup* group, int64_t bucket_size)
    : group_(group) {
  if (!group_ || params.empty()) return;
  MOE_ASSERT(num_buckets >= 1);
  BufferLayout layout;
  layout.num_layers = num_buckets - 1;
  layout.bucket_of = bucket_of;
  layout.bucket_size = bucket_size;
  layout.device = params.front()->grad.device();
  buckets_ = make_buckets(params, layout);
}

size_t GradBuckets::start(size_t b) {
  if (!group_) return 0;
  const std::vector<size_t> done = complete_buckets(buckets_, b);
  for (const size_t i : done) {
    BufferBucket& bk = buckets_[i];
    for (auto* p : bk.params) p->settle_grad();  // a gradient no backward wrote this step is zero
    bk.work = group_->all_reduce(bk.grad, comm::ReduceOp::Sum, /*async=*/true);
    bk.started = true;
  }
  // MPI moves a non-blocking collective along inside MPI calls: a test of the ones in flight lets them progress
  // while backward computes.
  for (auto& bk : buckets_)
    if (bk.started) bk.work.test();
  return done.size();
}

void GradBuckets::finish(double scale) {
  if (!group_) return;
  for (auto& bk : buckets_) {
    if (bk.started) continue;
    for (auto* p : bk.params) p->settle_grad();
    bk.work = group_->all_reduce(bk.grad, comm::ReduceOp::Sum, /*async=*/true);
  }
  for (auto& bk : buckets_) {
    bk.work.wait();
    bk.started = false;
    kernels::scale_(bk.grad, scale);
  }
  reset_pending(buckets_);
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
