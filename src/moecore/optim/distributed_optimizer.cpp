// Distributed optimizer (see distributed_optimizer.h).
#include "moecore/optim/distributed_optimizer.h"

#include <algorithm>
#include <map>

#include "moecore/core/timers.h"
#include "moecore/kernels/elementwise.h"

namespace moecore::optim {

ShardedAdamW::ShardedAdamW(std::vector<nn::Parameter*> params, const comm::ProcessGroup& group,
                           const std::function<double(const nn::Parameter&)>& norm_weight,
                           const std::function<size_t(const nn::Parameter&)>& bucket_of, ElementRule rule,
                           const comm::ProcessGroup* inter)
    : params_(params), group_(group), rule_(rule), inter_(inter && inter->size() > 1 ? inter : nullptr) {
  for (auto* p : params) {
    MOE_ASSERT(p->value.dtype() == DType::F32);
    const size_t b = bucket_of ? bucket_of(*p) : 0;
    if (buckets_.size() <= b) buckets_.resize(b + 1);
    Bucket& bk = buckets_[b];
    bk.segs.push_back({p, bk.size, norm_weight ? norm_weight(*p) : 1.0});
    bk.params.push_back(p);
    bk.size += p->value.numel();
  }
  const int64_t n = group_.size();
  // The flat buffers and the owned state live where the parameters do (a GPU's collectives stage through the host).
  const Device dev = params.empty() ? Device::cpu() : params.front()->value.device();
  int64_t owned = 0;
  for (auto& bk : buckets_) {
    bk.shard = (bk.size + n - 1) / n;  // padded so every rank owns the same number of elements
    bk.size = bk.shard * n;
    bk.local = owned;
    owned += bk.shard;
    bk.flat_grad = Tensor::zeros({bk.size}, DType::F32, dev);
    bk.flat_param = Tensor::zeros({bk.size}, DType::F32, dev);
  }
  grad_shard_ = Tensor::zeros({owned}, DType::F32, dev);
  master_shard_ = Tensor::zeros({owned}, DType::F32, dev);
  m_ = Tensor::zeros({owned}, rule_.exp_avg_dtype(DType::F32), dev);
  v_ = Tensor::zeros({owned}, rule_.exp_avg_sq_dtype(DType::F32), dev);
  refresh_master();  // from the (identically initialized) parameters
}

void ShardedAdamW::refresh_master() {
  for (auto& bk : buckets_) {
    for (const auto& s : bk.segs) bk.flat_param.slice(s.offset, s.p->value.numel()).copy_from(s.p->value);
    master_shard_.slice(bk.local, bk.shard).copy_from(bk.flat_param.slice(group_.rank() * bk.shard, bk.shard));
  }
}

template <typename Fn>
void ShardedAdamW::for_owned(const Bucket& bk, Fn fn) const {
  const int64_t lo = group_.rank() * bk.shard, hi = lo + bk.shard;
  for (const auto& s : bk.segs) {
    const int64_t a = std::max(lo, s.offset), b = std::min(hi, s.offset + s.p->value.numel());
    if (a < b) fn(s, a - lo + bk.local, b - a);  // owned-array offset, length
  }
}

void ShardedAdamW::gather_moments(std::vector<Tensor>& m, std::vector<Tensor>& v) const {
  std::map<const nn::Parameter*, size_t> index;
  for (size_t i = 0; i < params_.size(); i++) index[params_[i]] = i;
  m.assign(params_.size(), Tensor());
  v.assign(params_.size(), Tensor());
  for (const auto& bk : buckets_) {
    if (bk.segs.empty()) continue;
    for (auto [owned, out] : {std::pair{&m_, &m}, std::pair{&v_, &v}}) {
      Tensor flat = Tensor::empty({bk.size}, owned->dtype());  // the moments' storage dtype (bf16 or f32)
      group_.all_gather(owned->slice(bk.local, bk.shard), flat);
      for (const auto& s : bk.segs) {
        Tensor t = Tensor::empty(s.p->value.shape(), owned->dtype());
        t.copy_from(flat.slice(s.offset, s.p->value.numel()).reshape(t.shape()));
        (*out)[index[s.p]] = t;
      }
    }
  }
}

void ShardedAdamW::load_moments(const std::vector<Tensor>& m, const std::vector<Tensor>& v) {
  MOE_ASSERT(m.size() == params_.size() && v.size() == params_.size());
  std::map<const nn::Parameter*, size_t> index;
  for (size_t i = 0; i < params_.size(); i++) index[params_[i]] = i;
  refresh_master();
  for (auto& bk : buckets_) {
    for_owned(bk, [&](const Segment& s, int64_t off, int64_t len) {
      // The owned range [off, off + len) holds elements starting at (lo + off - local) - s.offset of the parameter.
      const int64_t first = group_.rank() * bk.shard + (off - bk.local) - s.offset;
      const size_t i = index[s.p];
      MOE_ASSERT(m[i].numel() == s.p->value.numel() && v[i].numel() == s.p->value.numel());
      Tensor mm = m_.slice(off, len), vv = v_.slice(off, len);  // converted to the storage dtype
      mm.copy_from(m[i].reshape({m[i].numel()}).slice(first, len));
      vv.copy_from(v[i].reshape({v[i].numel()}).slice(first, len));
    });
  }
}

void ShardedAdamW::start_bucket(size_t b) {
  if (b >= buckets_.size() || buckets_[b].segs.empty()) return;
  Bucket& bk = buckets_[b];
  MOE_ASSERT_MSG(!bk.started, "bucket {} reduced twice in one step", b);
  nn::pack_grads(bk.params, bk.flat_grad);
  Tensor out = grad_shard_.slice(bk.local, bk.shard);
  bk.work = group_.reduce_scatter(bk.flat_grad, out, comm::ReduceOp::Sum, /*async=*/true);
  bk.started = true;
}

double ShardedAdamW::reduce_gradients(double scale) {
  for (size_t b = 0; b < buckets_.size(); b++)
    if (!buckets_[b].started) start_bucket(b);
  double sq = 0;
  for (auto& bk : buckets_) {
    bk.work.wait();
    bk.started = false;
    Tensor g = grad_shard_.slice(bk.local, bk.shard);
    if (inter_) inter_->all_reduce(g);  // the other instances' sums of the same shard
    kernels::scale_(g, scale);
    for_owned(bk, [&](const Segment& s, int64_t off, int64_t len) {
      const Tensor part = grad_shard_.slice(off, len);
      sq += s.norm_weight * kernels::sum_squares(part);
    });
  }
  return sq;
}

double ShardedAdamW::zero_share() const {
  double zeros = 0;
  for (const auto& bk : buckets_)
    for_owned(bk, [&](const Segment& s, int64_t off, int64_t len) {
      zeros += s.norm_weight * static_cast<double>(kernels::count_zeros(grad_shard_.slice(off, len)));
    });
  return zeros;
}

void ShardedAdamW::step(const kernels::AdamWParams& hp, int64_t step) {
  // Each parameter overlapping the owned range updates its part with its own weight decay: the parts of the flat
  // shards in one multi-tensor pass.
  std::vector<kernels::AdamWTensor> parts;
  for (auto& bk : buckets_) {
    for_owned(bk, [&](const Segment& s, int64_t off, int64_t len) {
      parts.push_back({master_shard_.slice(off, len), grad_shard_.slice(off, len), m_.slice(off, len),
                       v_.slice(off, len), s.p->no_weight_decay ? 0.0 : hp.weight_decay});
    });
  }
  element_step_multi(rule_, parts, hp, step);
  TimerScope timer("params-all-gather", 1);  // Megatron's level-1 timer (core/timers.h)
  for (auto& bk : buckets_) {
    if (bk.segs.empty()) continue;
    bk.work = group_.all_gather(master_shard_.slice(bk.local, bk.shard), bk.flat_param, /*async=*/true);
  }
  for (auto& bk : buckets_) {
    if (bk.segs.empty()) continue;
    bk.work.wait();
    for (const auto& s : bk.segs) s.p->value.copy_from(bk.flat_param.slice(s.offset, s.p->value.numel()));
  }
}

}  // namespace moecore::optim
