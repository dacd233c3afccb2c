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
                         const comm::ProcessGroup* group, int64_t bucket_size, GradPrecision precision, double scale)
    : group_(group), precision_(precision), scale_(scale) {
  if (!group_ || params.empty()) return;
  MOE_ASSERT(num_buckets >= 1);
  BufferLayout layout;
  layout.num_layers = num_buckets - 1;
  layout.bucket_of = bucket_of;
  layout.bucket_size = bucket_size;
  layout.device = params.front()->grad.device();
  buckets_ = make_buckets(params, layout);
}

void GradBuckets::reduce(BufferBucket& bk) {
  for (auto* p : bk.params) p->settle_grad();  // a gradient no backward wrote this step is zero
  bk.started = true;
  if (!precision_.low()) {
    bk.work = group_->all_reduce(bk.grad, comm::ReduceOp::Sum, /*async=*/true);
    return;
  }
  // Megatron's: the buffer scaled by 1/DP and all-reduced in the comm dtype, the result held in the main dtype.
  low_precision_all_reduce(*group_, bk.grad, precision_.comm, scale_);
  round_to_dtype(bk.grad, precision_.main);
}

size_t GradBuckets::start(size_t b) {
  if (!group_) return 0;
  const std::vector<size_t> done = complete_buckets(buckets_, b);
  for (const size_t i : done) reduce(buckets_[i]);
  // MPI moves a non-blocking collective along inside MPI calls: a test of the ones in flight lets them progress
  // while backward computes.
  for (auto& bk : buckets_)
    if (bk.started) bk.work.test();
  return done.size();
}

void GradBuckets::finish(double scale) {
  if (!group_) return;
  for (auto& bk : buckets_)
    if (!bk.started) reduce(bk);
  for (auto& bk : buckets_) {
    if (bk.work.pending()) bk.work.wait();
    bk.started = false;
    if (!precision_.low()) kernels::scale_(bk.grad, scale);  // else pre-scaled
  }
  reset_pending(buckets_);
}

SequenceParallelGrads::SequenceParallelGrads(const std::vector<nn::Parameter*>& params, size_t num_buckets,
                                             const BucketOf& bucket_of, const comm::ProcessGroup* tp, DType main)
    : by_bucket_(num_buckets), tp_(tp), main_(main) {
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
  if (main_ == DType::F32)
    tp_->all_reduce(flat);
  else
    low_precision_all_reduce(*tp_, flat, main_, 1.0);
  nn::unpack_grads(flat, ps);
}

}  // namespace moecore::optim
