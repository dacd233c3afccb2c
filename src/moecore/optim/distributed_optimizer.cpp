// Distributed optimizer (see distributed_optimizer.h).
#include "moecore/optim/distributed_optimizer.h"

#include <algorithm>
#include <cstring>

#include "moecore/kernels/cpu/elementwise.h"

namespace moecore::optim {

ShardedAdamW::ShardedAdamW(std::vector<nn::Parameter*> params, const comm::ProcessGroup& group,
                           const std::function<double(const nn::Parameter&)>& norm_weight)
    : group_(group) {
  for (auto* p : params) {
    MOE_ASSERT(p->value.dtype() == DType::F32);
    segs_.push_back({p, total_, norm_weight ? norm_weight(*p) : 1.0});
    total_ += p->value.numel();
  }
  const int64_t n = group_.size();
  shard_ = (total_ + n - 1) / n;  // padded so every rank owns the same number of elements
  flat_grad_ = Tensor::zeros({shard_ * n}, DType::F32);
  flat_param_ = Tensor::zeros({shard_ * n}, DType::F32);
  grad_shard_ = Tensor::zeros({shard_}, DType::F32);
  master_shard_ = Tensor::zeros({shard_}, DType::F32);
  m_ = Tensor::zeros({shard_}, DType::F32);
  v_ = Tensor::zeros({shard_}, DType::F32);
  // fp32 master shard from the (identically initialized) parameters.
  for (const auto& s : segs_)
    std::memcpy(flat_param_.data<float>() + s.offset, s.p->value.raw(), s.p->value.nbytes());
  std::memcpy(master_shard_.raw(), flat_param_.data<float>() + group_.rank() * shard_, static_cast<size_t>(shard_) * 4);
}

double ShardedAdamW::reduce_gradients(double scale) {
  for (const auto& s : segs_) std::memcpy(flat_grad_.data<float>() + s.offset, s.p->grad.raw(), s.p->grad.nbytes());
  group_.reduce_scatter(flat_grad_, grad_shard_);
  kernels::scale_(grad_shard_, scale);
  const int64_t lo = group_.rank() * shard_, hi = lo + shard_;
  double sq = 0;
  for (const auto& s : segs_) {
    const int64_t a = std::max(lo, s.offset), b = std::min(hi, s.offset + s.p->value.numel());
    if (a < b) sq += s.norm_weight * kernels::sum_squares(grad_shard_.slice(a - lo, b - a));
  }
  return sq;
}

void ShardedAdamW::scale_gradients(double s) { kernels::scale_(grad_shard_, s); }

void ShardedAdamW::step(const kernels::AdamWParams& hp, int64_t step) {
  const int64_t lo = group_.rank() * shard_, hi = lo + shard_;
  // Each parameter overlapping the owned range updates its part with its own weight decay.
  for (const auto& s : segs_) {
    const int64_t a = std::max(lo, s.offset), b = std::min(hi, s.offset + s.p->value.numel());
    if (a >= b) continue;
    kernels::AdamWParams h = hp;
    if (s.p->no_weight_decay) h.weight_decay = 0;
    Tensor pm = master_shard_.slice(a - lo, b - a), g = grad_shard_.slice(a - lo, b - a);
    Tensor mm = m_.slice(a - lo, b - a), vv = v_.slice(a - lo, b - a);
    kernels::adamw_step(pm, g, mm, vv, h, step);
  }
  group_.all_gather(master_shard_, flat_param_);
  for (const auto& s : segs_)
    std::memcpy(s.p->value.raw(), flat_param_.data<float>() + s.offset, s.p->value.nbytes());
}

}  // namespace moecore::optim
