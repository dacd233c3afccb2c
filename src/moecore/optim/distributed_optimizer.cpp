// Distributed optimizer (see distributed_optimizer.h).
#include "moecore/optim/distributed_optimizer.h"

#include <algorithm>
#include <map>

#include "moecore/core/timers.h"
#include "moecore/kernels/elementwise.h"

namespace moecore::optim {

ShardedAdamW::ShardedAdamW(std::vector<nn::Parameter*> params, const comm::ProcessGroup& group,
                           const std::function<double(const nn::Parameter&)>& norm_weight, const BucketOf& bucket_of,
                           ElementRule rule, const comm::ProcessGroup* inter, size_t num_layers, int64_t bucket_size,
                           const FsdpOptions& fsdp)
    : sharding_(fsdp.sharding),
      precision_(fsdp.precision),
      grad_scale_(fsdp.grad_scale),
      double_buffer_(fsdp.double_buffer && fsdp.sharding == Sharding::OptimGradsParams),
      init_shards_(fsdp.init_shards),
      outer_(fsdp.outer_shard && inter != nullptr && inter->size() > 1),
      seed_(fsdp.seed),
      params_(params),
      group_(group),
      rule_(rule),
      inter_(inter && inter->size() > 1 ? inter : nullptr) {
  MOE_ASSERT_MSG(sharding_ != Sharding::NoShard, "no_shard is the replicated optimizer");
  MOE_ASSERT_MSG(sharding_ == Sharding::Optim || bucket_size == 0, "an FSDP unit is one bucket per layer bucket");
  MOE_ASSERT_MSG(!init_shards_ || sharding_ == Sharding::OptimGradsParams, "only sharded parameters start sharded");
  MOE_ASSERT_MSG(!outer_ || sharding_ == Sharding::OptimGradsParams, "outer sharding needs sharded parameters");
  BufferLayout layout;
  for (auto* p : params) {
    MOE_ASSERT_MSG(p->math_dtype() == DType::F32, "{}: the distributed optimizer keeps f32 state", p->name);
    if (bucket_of) num_layers = std::max(num_layers, bucket_of(*p));
  }
  layout.num_layers = num_layers;
  num_layers_ = num_layers;
  layout.bucket_of = bucket_of;
  layout.bucket_size = bucket_size;
  layout.shards = group_.size() * (outer_ ? inter_->size() : 1);
  layout.param_buffers = true;
  layout.layout_only = init_shards_;
  // The buffers and the owned state live where the parameters do (a GPU's collectives stage through the host).
  layout.device = params.empty() ? Device::cpu() : params.front()->value.device();
  // The values as they are (f32) until the buffers hold them: the bf16-stored parameters' master shards come from
  // these.
  std::map<const nn::Parameter*, Tensor> full;
  if (!init_shards_)
    for (auto* p : params) full[p] = p->value;
  const int64_t n = group_.size();
  int64_t owned = 0, mastered = 0;
  for (auto& b : make_buckets(params, layout)) {
    Bucket bk;
    bk.buf = std::move(b);
    bk.shard = bk.buf.padded / n;
    bk.local = owned;
    owned += state_len(bk);
    if (has_master(bk)) {
      bk.master = mastered;
      mastered += state_len(bk);
    }
    // With the state sharded across the instances too each element has one owner, not one per instance.
    const double owners = outer_ ? static_cast<double>(inter_->size()) : 1.0;
    for (size_t i = 0; i < bk.buf.params.size(); i++) {
      nn::Parameter* p = bk.buf.params[i];
      bk.segs.push_back({p, bk.buf.offsets[i], (norm_weight ? norm_weight(*p) : 1.0) * owners, p->value.shape()});
    }
    if (!init_shards_) {
      bk.grad_shard = bk.buf.grad.slice(group_.rank() * bk.shard, bk.shard);
      bk.param_shard = bk.buf.param.slice(group_.rank() * bk.shard, bk.shard);
    }
    buckets_.push_back(std::move(bk));
  }
  master_ = Tensor::zeros({mastered}, DType::F32, layout.device);
  m_ = Tensor::zeros({owned}, rule_.exp_avg_dtype(DType::F32), layout.device);
  v_ = Tensor::zeros({owned}, rule_.exp_avg_sq_dtype(DType::F32), layout.device);
  for (auto& bk : buckets_) {
    if (!has_master(bk) || init_shards_) continue;  // sharded initialisation: in shard_units
    for_owned(bk, [&](const Segment& s, int64_t /*off*/, int64_t len, int64_t at) {
      const Tensor& f = full.at(s.p);
      master_.slice(bk.master + at - state_lo(bk), len).copy_from(f.reshape({f.numel()}).slice(at - s.offset, len));
    });
  }
  if (sharding_ != Sharding::Optim) shard_units();
  cast_fp8();  // the FP8 parameters from their masters (nothing where there are none)
  if (!params_sharded())
    for (auto& bk : buckets_)
      if (bk.buf.fp8) gather_fp8(bk);
}

Tensor ShardedAdamW::gather_state(const Bucket& bk, const Tensor& part) const {
  Tensor shard = part.to(Device::cpu());
  if (outer_) {  // the instances' parts of this shard first
    Tensor whole = Tensor::empty({bk.shard}, part.dtype());
    inter_->all_gather(shard, whole);
    shard = whole;
  }
  Tensor flat = Tensor::empty({bk.buf.padded}, part.dtype());
  group_.all_gather(shard, flat);
  return flat;
}

void ShardedAdamW::gather_moments(std::vector<Tensor>& m, std::vector<Tensor>& v) const {
  std::map<const nn::Parameter*, size_t> index;
  for (size_t i = 0; i < params_.size(); i++) index[params_[i]] = i;
  m.assign(params_.size(), Tensor());
  v.assign(params_.size(), Tensor());
  for (const auto& bk : buckets_) {
    for (auto [owned, out] : {std::pair{&m_, &m}, std::pair{&v_, &v}}) {
      // In the moments' storage dtype (bf16 or f32).
      const Tensor flat = gather_state(bk, owned->slice(bk.local, state_len(bk)));
      for (const auto& s : bk.segs) {
        Tensor t = Tensor::empty(s.shape, owned->dtype());
        t.copy_from(flat.slice(s.offset, s.numel()).reshape(t.shape()));
        (*out)[index[s.p]] = t;
      }
    }
  }
}

void ShardedAdamW::load_moments(const std::vector<Tensor>& m, const std::vector<Tensor>& v) {
  MOE_ASSERT(m.size() == params_.size() && v.size() == params_.size());
  std::map<const nn::Parameter*, size_t> index;
  for (size_t i = 0; i < params_.size(); i++) index[params_[i]] = i;
  for (auto& bk : buckets_) {
    for_owned(bk, [&](const Segment& s, int64_t off, int64_t len, int64_t at) {
      const size_t i = index[s.p];
      MOE_ASSERT(m[i].numel() == s.numel() && v[i].numel() == s.numel());
      Tensor mm = m_.slice(off, len), vv = v_.slice(off, len);  // converted to the storage dtype
      mm.copy_from(m[i].reshape({m[i].numel()}).slice(at - s.offset, len));
      vv.copy_from(v[i].reshape({v[i].numel()}).slice(at - s.offset, len));
    });
  }
}

void ShardedAdamW::gather_master(std::vector<Tensor>& w) const {
  std::map<const nn::Parameter*, size_t> index;
  for (size_t i = 0; i < params_.size(); i++) index[params_[i]] = i;
  w.assign(params_.size(), Tensor());
  for (const auto& bk : buckets_) {
    if (!has_master(bk) && !params_sharded()) {  // f32 values are their own masters, whole here
      for (const auto& s : bk.segs) w[index[s.p]] = s.p->value.to(Device::cpu()).clone();
      continue;
    }
    // The owners' master shards (an f32 parameter's shard is its master), gathered.
    Tensor flat = Tensor::empty({bk.buf.padded}, DType::F32);
    if (has_master(bk))
      flat = gather_state(bk, master_.slice(bk.master, state_len(bk)));
    else  // the whole shard on every rank of the instance
      group_.all_gather(bk.param_shard.to(Device::cpu()), flat);
    for (const auto& s : bk.segs) w[index[s.p]] = flat.slice(s.offset, s.numel()).reshape(s.shape).clone();
  }
}

std::vector<HeldValues> ShardedAdamW::held_values() const {
  if (!params_sharded()) return ParamClassOptimizer::held_values();
  std::vector<HeldValues> held;  // the owned parameter shards
  for (const auto& bk : buckets_)
    for_range(bk, lo(bk), bk.shard, [&](const Segment& s, int64_t rel, int64_t len, int64_t at) {
      held.push_back({s.p, at - s.offset, bk.param_shard.slice(rel, len)});
    });
  return held;
}

void ShardedAdamW::load_master(const std::vector<Tensor>& w) {
  MOE_ASSERT(w.size() == params_.size());
  std::map<const nn::Parameter*, size_t> index;
  for (size_t i = 0; i < params_.size(); i++) index[params_[i]] = i;
  for (auto& bk : buckets_) {
    if (params_sharded()) {  // the owned parameter shard (rounded where stored in bf16); nothing gathered holds them
      MOE_ASSERT_MSG(!bk.resident, "parameters loaded while their unit is gathered");
      for_range(bk, lo(bk), bk.shard, [&](const Segment& s, int64_t rel, int64_t len, int64_t at) {
        const Tensor& f = w[index[s.p]];
        bk.param_shard.slice(rel, len).copy_from(f.reshape({f.numel()}).slice(at - s.offset, len));
      });
    } else {
      for (const auto& s : bk.segs) s.p->value.copy_from(w[index[s.p]]);  // rounded where stored in bf16
    }
    if (!has_master(bk)) continue;
    for_owned(bk, [&](const Segment& s, int64_t /*off*/, int64_t len, int64_t at) {
      const Tensor& f = w[index[s.p]];
      master_.slice(bk.master + at - state_lo(bk), len).copy_from(f.reshape({f.numel()}).slice(at - s.offset, len));
    });
  }
  cast_fp8();  // the FP8 parameters cast from the loaded masters, as after a step
  if (!params_sharded())
    for (auto& bk : buckets_)
      if (bk.buf.fp8) gather_fp8(bk);
}

std::vector<double> ShardedAdamW::master_squares() const {
  std::map<const nn::Parameter*, size_t> index;
  for (size_t i = 0; i < params_.size(); i++) index[params_[i]] = i;
  std::vector<double> sq(params_.size(), 0.0);
  const auto shards = static_cast<double>(group_.size() * (outer_ ? inter_->size() : 1));
  for (const auto& bk : buckets_) {
    if (!has_master(bk) && !params_sharded()) {  // whole on every rank
      for (const auto& s : bk.segs) sq[index[s.p]] = kernels::sum_squares(s.p->value);
      continue;
    }
    for_owned(bk, [&](const Segment& s, int64_t /*off*/, int64_t len, int64_t at) {
      const Tensor w =
          has_master(bk) ? master_.slice(bk.master + at - state_lo(bk), len) : bk.param_shard.slice(at - lo(bk), len);
      sq[index[s.p]] += shards * kernels::sum_squares(w);
    });
  }
  return sq;
}

void ShardedAdamW::start(Bucket& bk) {
  MOE_ASSERT_MSG(!bk.buf.started, "a bucket reduced twice in one step");
  for (auto* p : bk.buf.params) p->settle_grad();  // a gradient no backward wrote this step is zero
  if (bk.buf.padded > bk.buf.numel) bk.buf.grad.slice(bk.buf.numel, bk.buf.padded - bk.buf.numel).zero_();
  bk.buf.started = true;
  if (precision_.low())  // Megatron's fp16/bf16 buffer: scaled by 1/DP and reduce-scattered in its dtype
    low_precision_reduce_scatter_in_place(group_, bk.buf.grad, precision_.comm, grad_scale_);
  else
    bk.buf.work = group_.reduce_scatter_in_place(bk.buf.grad, comm::ReduceOp::Sum, /*async=*/true);
  // MPI moves a non-blocking collective along inside MPI calls: a test of the ones in flight lets them progress
  // while backward computes.
  for (auto& other : buckets_)
    if (other.buf.started) other.buf.work.test();
}

size_t ShardedAdamW::start_bucket(size_t b) {
  if (grads_sharded()) return 0;  // each unit's backward reduces its own (unit_backward_done)
  size_t started = 0;
  for (auto& bk : buckets_) {
    BufferBucket& buf = bk.buf;
    if (std::find(buf.layers.begin(), buf.layers.end(), b) == buf.layers.end()) continue;
    MOE_ASSERT_MSG(buf.pending > 0, "layer {} reported final twice in one step", b);
    if (--buf.pending == 0) {
      start(bk);
      started++;
    }
  }
  return started;
}

void ShardedAdamW::reduce_gradients(double scale, float unscale, kernels::ClipState& clip) {
  if (grads_sharded()) {
    free_all_units();
  } else {
    for (auto& bk : buckets_)
      if (!bk.buf.started) start(bk);
  }
  norm_terms_.clear();
  norm_weights_.clear();
  for (auto& bk : buckets_) {
    if (grads_sharded()) {
      if (!bk.summed) bk.grad_shard.zero_();  // no backward reached this unit: its gradients are zero
      bk.summed = false;
    } else {
      bk.buf.work.wait();
      bk.buf.started = false;
      bk.buf.pending = bk.buf.layers.size();
    }
    Tensor& g = bk.grad_shard;  // this rank's region: its sum
    if (precision_.low()) {     // pre-scaled; the other instances' sums in the comm dtype, held in the main dtype
      if (outer_)
        low_precision_reduce_scatter_in_place(*inter_, g, precision_.comm, 1.0);
      else if (inter_)
        low_precision_all_reduce(*inter_, g, precision_.comm, 1.0);
      round_to_dtype(g, precision_.main);
    } else {
      if (outer_)  // the other instances' sums of the same shard, each rank its part of them
        inter_->reduce_scatter_in_place(g);
      else if (inter_)
        inter_->all_reduce(g);
      kernels::scale_(g, scale);
    }
    if (unscale != 1.0f) kernels::scale_(g, unscale);  // the loss scale out of this rank's main gradients
    for_owned(bk, [&](const Segment& s, int64_t /*off*/, int64_t len, int64_t at) {
      norm_terms_.push_back(bk.grad_shard.slice(at - lo(bk), len));
      norm_weights_.push_back(s.norm_weight);
    });
  }
  kernels::squares_add_part(clip, norm_terms_, norm_weights_);
}

double ShardedAdamW::zero_share() const {
  double zeros = 0;
  for (const auto& bk : buckets_)
    for_owned(bk, [&](const Segment& s, int64_t /*off*/, int64_t len, int64_t at) {
      zeros += s.norm_weight * static_cast<double>(kernels::count_zeros(bk.grad_shard.slice(at - lo(bk), len)));
    });
  return zeros;
}

void ShardedAdamW::step(const kernels::AdamWParams& hp, int64_t step) {
  // Each parameter overlapping the owned range updates its part with its own weight decay, all in one multi-tensor
  // pass: an f32 parameter in place in its parameter buffer; a bf16-stored one on its f32 master shard, the rounded
  // result written into its parameter buffer.
  std::vector<kernels::AdamWTensor> parts;
  for (auto& bk : buckets_) {
    const int64_t lo = group_.rank() * bk.shard, state = state_lo(bk);
    for_owned(bk, [&](const Segment& s, int64_t off, int64_t len, int64_t at) {
      const double wd = s.p->no_weight_decay ? 0.0 : hp.weight_decay;
      const Tensor g = bk.grad_shard.slice(at - lo, len), p = bk.param_shard.slice(at - lo, len);
      if (bk.buf.fp8)  // the master updated; the values are cast from it below
        parts.push_back({master_.slice(bk.master + at - state, len), g, m_.slice(off, len), v_.slice(off, len), wd});
      else if (has_master(bk))
        parts.push_back({master_.slice(bk.master + at - state, len), g, m_.slice(off, len), v_.slice(off, len), wd, p});
      else
        parts.push_back({p, g, m_.slice(off, len), v_.slice(off, len), wd});
    });
  }
  element_step_multi(rule_, parts, hp, step);
  cast_fp8();              // Megatron's quantize_param_shard: the FP8 parameters' owned shards from their masters
  if (params_sharded()) {  // each unit is gathered from the updated shards as it is read
    if (outer_)            // each instance's shard whole again from the parts its ranks updated (FP8: cast_fp8)
      for (auto& bk : buckets_)
        if (!bk.buf.fp8) inter_->all_gather_in_place(bk.param_shard);
    return;
  }
  TimerScope timer("params-all-gather", 1);  // Megatron's level-1 timer (core/timers.h)
  for (auto& bk : buckets_)                  // FP8 bytes gathered now, whether or not the others overlap
    if (bk.buf.fp8) gather_fp8(bk);
  if (overlap_gather_) {  // left in flight for the next forward (wait_param_gather)
    for (auto& bk : buckets_) {
      MOE_ASSERT_MSG(!bk.gather_pending, "a parameter all-gather of the last step was never waited");
      bk.gather_pending = !bk.buf.fp8;
    }
    for (const size_t i : gather_order_) {
      dispatch_gather(buckets_[i]);
      if (!gather_with_step_) break;
    }
    return;
  }
  for (auto& bk : buckets_)
    if (!bk.buf.fp8) bk.buf.work = group_.all_gather_in_place(bk.buf.param, /*async=*/true);
  for (auto& bk : buckets_)
    if (!bk.buf.fp8) bk.buf.work.wait();
}

void ShardedAdamW::overlap_param_gather(bool with_step) {
  overlap_gather_ = true;
  gather_with_step_ = with_step;
  // A bucket's place in the forward: its earliest layer, the embedding's layer bucket (num_layers_) before layer 0.
  auto first_read = [this](const Bucket& bk) {
    int64_t first = static_cast<int64_t>(num_layers_);
    for (const size_t l : bk.buf.layers) first = std::min(first, l == num_layers_ ? -1 : static_cast<int64_t>(l));
    return first;
  };
  gather_order_.clear();
  for (size_t i = 0; i < buckets_.size(); i++) gather_order_.push_back(i);
  std::stable_sort(gather_order_.begin(), gather_order_.end(),
                   [&](size_t a, size_t b) { return first_read(buckets_[a]) < first_read(buckets_[b]); });
}

void ShardedAdamW::dispatch_gather(Bucket& bk) {
  if (bk.gather.pending() || !bk.gather_pending) return;
  bk.gather = group_.all_gather_in_place(bk.buf.param, /*async=*/true);
}

void ShardedAdamW::wait_param_gather(size_t b) {
  for (size_t k = 0; k < gather_order_.size(); k++) {
    Bucket& bk = buckets_[gather_order_[k]];
    if (!bk.gather_pending || std::find(bk.buf.layers.begin(), bk.buf.layers.end(), b) == bk.buf.layers.end()) continue;
    dispatch_gather(bk);  // not dispatched yet: the forward reached it first
    {
      TimerScope timer("params-all-gather", 1);
      bk.gather.wait();
    }
    bk.gather_pending = false;
    // Megatron's finish_param_sync: the next bucket's all-gather goes out as this one is consumed.
    if (!gather_with_step_ && k + 1 < gather_order_.size()) dispatch_gather(buckets_[gather_order_[k + 1]]);
  }
}

size_t ShardedAdamW::param_gathers_pending() const {
  size_t n = 0;
  for (const auto& bk : buckets_) n += bk.gather_pending ? 1 : 0;
  return n;
}

void ShardedAdamW::finish_param_gather() {
  for (const size_t i : gather_order_) dispatch_gather(buckets_[i]);
  for (const size_t i : gather_order_) {
    buckets_[i].gather.wait();
    buckets_[i].gather_pending = false;
  }
}

}  // namespace moecore::optim
