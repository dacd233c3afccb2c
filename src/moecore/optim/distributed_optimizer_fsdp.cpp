// Megatron FSDP's units in the distributed optimizer (see distributed_optimizer.h): under optim_grads the whole
// gradients of a unit live only from its backward's start to its end in each micro-batch, reduce-scattered into the
// owned shard (Megatron FSDP reduces every micro-batch under optim_grads and optim_grads_params: a sum of per-micro-
// batch reductions, the distributed optimizer's reduction of the sum with one micro-batch); under optim_grads_params
// the whole parameters live only while a forward or a backward reads them, all-gathered from the owned shards.
#include <algorithm>

#include "moecore/core/timers.h"
#include "moecore/kernels/elementwise.h"
#include "moecore/optim/distributed_optimizer.h"

namespace moecore::optim {

namespace {
// What a parameter's value or gradient is while its unit holds none: its shape and dtype, no storage.
Tensor released(const Shape& shape, DType dt, Device d) {
  return Tensor::unallocated(shape, dt, d);
}
int dtype_slot(DType dt) {
  return dt == DType::BF16 ? 0 : dt == DType::F16 ? 1 : dt == DType::F32 ? 2 : 3;
}
}  // namespace

void ShardedAdamW::shard_units() {
  int64_t largest[4] = {0, 0, 0, 0};
  const Device d = params_.empty() ? Device::cpu() : params_.front()->value.device();
  for (auto& bk : buckets_) {
    const DType gt = bk.segs.front().p->math_dtype(), st = bk.buf.storage;
    // Gradients: the owned shard only, a tensor of its own; whole ones are taken per unit backward.
    bk.grad_shard = Tensor::zeros({bk.shard}, gt, d);
    bk.buf.grad = Tensor();
    for (const auto& s : bk.segs) {
      s.p->grad = released(s.shape, gt, d);
      s.p->grad_stale = false;
    }
    bk.grads_live = false;
    if (!params_sharded()) continue;
    // Parameters: the owned shard, copied out of the laid-out buffer, which goes; or, where the parameters arrived
    // unallocated, drawn here element by element (and the bf16-stored ones' f32 masters with them).
    if (init_shards_) {
      bk.param_shard = Tensor::zeros({bk.shard}, st, d);
      for_range(bk, lo(bk), bk.shard, [&](const Segment& s, int64_t rel, int64_t len, int64_t at) {
        Tensor v = Tensor::empty({len}, gt, d);
        nn::init_parameter_range(*s.p, seed_, at - s.offset, v);
        bk.param_shard.slice(rel, len).copy_from(v);  // rounded where stored in bf16
      });
      if (has_master(bk))
        for_owned(bk, [&](const Segment& s, int64_t /*off*/, int64_t len, int64_t at) {
          Tensor v = Tensor::empty({len}, gt, d);
          nn::init_parameter_range(*s.p, seed_, at - s.offset, v);
          master_.slice(bk.master + at - state_lo(bk), len).copy_from(v);
        });
    } else {
      bk.param_shard = bk.buf.param.slice(lo(bk), bk.shard).clone();
    }
    bk.buf.param = Tensor();
    for (const auto& s : bk.segs) s.p->value = released(s.shape, st, d);
    bk.resident = false;
    largest[dtype_slot(st)] = std::max(largest[dtype_slot(st)], bk.buf.padded);
  }
  if (!double_buffer_) return;
  const DType kinds[4] = {DType::BF16, DType::F16, DType::F32, DType::F64};
  for (int k = 0; k < 4; k++)
    for (int j = 0; j < 2; j++) slots_.push_back(largest[k] > 0 ? Tensor::empty({largest[k]}, kinds[k], d) : Tensor());
}

std::vector<size_t> ShardedAdamW::unit_buckets(size_t b) const {
  std::vector<size_t> out;
  for (size_t i = 0; i < buckets_.size(); i++)
    if (std::find(buckets_[i].buf.layers.begin(), buckets_[i].buf.layers.end(), b) != buckets_[i].buf.layers.end())
      out.push_back(i);
  return out;
}

// --- gradients ---------------------------------------------------------------------------------------------------

void ShardedAdamW::take_grads(Bucket& bk) {
  if (bk.grads_live) return;
  if (bk.reducing) finish_grad_reduce(bk);  // the last micro-batch's reduction of this unit, still in flight
  const Device d = bk.grad_shard.device();
  bk.buf.grad = Tensor::zeros({bk.buf.padded}, bk.grad_shard.dtype(), d);
  for (const auto& s : bk.segs) {
    s.p->grad = bk.buf.grad.slice(s.offset, s.numel()).reshape(s.shape);
    s.p->grad_stale = false;
  }
  bk.grads_live = true;
}

void ShardedAdamW::start_grad_reduce(Bucket& bk) {
  MOE_ASSERT_MSG(bk.grads_live && !bk.reducing, "a unit's gradients reduced without a backward");
  for (const auto& s : bk.segs) s.p->settle_grad();
  if (precision_.low())  // Megatron FSDP's grad_comm_dtype: scaled by 1/DP and reduce-scattered in it
    low_precision_reduce_scatter_in_place(group_, bk.buf.grad, precision_.comm, grad_scale_);
  else
    bk.buf.work = group_.reduce_scatter_in_place(bk.buf.grad, comm::ReduceOp::Sum, /*async=*/true);
  bk.reducing = true;
  const DType gt = bk.buf.grad.dtype();
  for (const auto& s : bk.segs)
    s.p->grad = released(s.shape, gt, bk.grad_shard.device());  // the buffer is the collective's
  bk.grads_live = false;
  for (auto& other : buckets_)  // MPI progresses what is in flight inside its calls
    if (other.reducing) other.buf.work.test();
}

void ShardedAdamW::finish_grad_reduce(Bucket& bk) {
  if (!bk.reducing) return;
  {
    TimerScope timer("grads-reduce-scatter", 1);
    bk.buf.work.wait();
  }
  const Tensor sum = bk.buf.grad.slice(lo(bk), bk.shard);
  if (bk.summed)
    kernels::add_(bk.grad_shard, sum);
  else
    bk.grad_shard.copy_from(sum);                  // the step's first: the sum itself, as the distributed optimizer's
  round_to_dtype(bk.grad_shard, precision_.main);  // Megatron FSDP's main_grads_dtype: accumulated, rounded
  bk.summed = true;
  bk.reducing = false;
  bk.buf.grad = Tensor();
}

// --- parameters --------------------------------------------------------------------------------------------------

void ShardedAdamW::post_gather(Bucket& bk, bool prefetch) {
  if (bk.resident || bk.gathering) return;
  const DType st = bk.param_shard.dtype();
  if (double_buffer_) {
    bk.slot = -1;
    for (int j = 0; j < 2 && bk.slot < 0; j++) {
      const int k = dtype_slot(st) * 2 + (next_slot_ + j) % 2;
      bool used = false;
      for (const auto& o : buckets_)
        used = used || ((o.resident || o.gathering) && o.slot == k && o.param_shard.dtype() == st);
      if (!used) bk.slot = k;
    }
    if (bk.slot < 0 && prefetch) return;  // gathered when it is read instead
    MOE_CHECK(bk.slot >= 0,
              "--fsdp-double-buffer: a third unit's parameters are needed while two are gathered (full recompute of "
              "several layers reads them together); drop --fsdp-double-buffer");
    next_slot_ = (bk.slot + 1) % 2;
    bk.buf.param = slots_[static_cast<size_t>(bk.slot)].slice(0, bk.buf.padded);
  } else {
    bk.buf.param = Tensor::empty({bk.buf.padded}, st, bk.param_shard.device());
  }
  if (bk.buf.fp8) {  // the owned FP8 bytes, read back into buf.param when waited on
    bk.codes_all = Tensor::empty({bk.codes.numel() * group_.size()}, DType::I32, bk.codes.device());
    bk.gather = group_.all_gather(bk.codes, bk.codes_all, /*async=*/true);
  } else {
    bk.gather = group_.all_gather(bk.param_shard, bk.buf.param, /*async=*/true);
  }
  bk.gathering = true;
}

void ShardedAdamW::wait_gathered(Bucket& bk) {
  if (bk.resident) return;
  post_gather(bk);
  {
    TimerScope timer("params-all-gather", 1);
    bk.gather.wait();
  }
  if (bk.buf.fp8) decode_gathered(bk);
  bk.gathering = false;
  bk.resident = true;
  for (const auto& s : bk.segs) s.p->value = bk.buf.param.slice(s.offset, s.numel()).reshape(s.shape);
}

void ShardedAdamW::free_params(Bucket& bk) {
  if (bk.gathering) wait_gathered(bk);  // a prefetch nobody read: completed, then dropped
  if (!bk.resident) return;
  const DType st = bk.param_shard.dtype();
  for (const auto& s : bk.segs) s.p->value = released(s.shape, st, bk.param_shard.device());
  bk.buf.param = Tensor();
  bk.resident = false;
  bk.slot = -1;
}

void ShardedAdamW::free_all_units() {
  for (auto& bk : buckets_) {
    if (bk.grads_live) start_grad_reduce(bk);  // a unit whose backward did not report its end
    finish_grad_reduce(bk);
    if (params_sharded()) free_params(bk);
  }
}

// --- the hooks ---------------------------------------------------------------------------------------------------

void ShardedAdamW::unit_forward(size_t b) {
  if (!params_sharded()) return;
  for (const size_t i : unit_buckets(b)) wait_gathered(buckets_[i]);
}

void ShardedAdamW::unit_prefetch(size_t b) {
  if (!params_sharded()) return;
  for (const size_t i : unit_buckets(b)) post_gather(buckets_[i], /*prefetch=*/true);
}

void ShardedAdamW::unit_forward_done(size_t b) {
  if (!params_sharded()) return;
  for (const size_t i : unit_buckets(b)) free_params(buckets_[i]);
}

void ShardedAdamW::unit_backward(size_t b) {
  if (!grads_sharded()) return;
  if (params_sharded())
    for (const size_t i : unit_buckets(b)) wait_gathered(buckets_[i]);
  for (const size_t i : unit_buckets(b)) take_grads(buckets_[i]);
}

void ShardedAdamW::unit_backward_done(size_t b) {
  if (!grads_sharded()) return;
  for (const size_t i : unit_buckets(b)) {
    Bucket& bk = buckets_[i];
    if (!bk.grads_live) continue;
    // The previous unit's reduction completes as this one's starts: one unit in flight beside the backward.
    for (auto& other : buckets_)
      if (other.reducing) finish_grad_reduce(other);
    start_grad_reduce(bk);
    if (params_sharded()) free_params(bk);
  }
}

size_t ShardedAdamW::buckets_gathered() const {
  size_t n = 0;
  for (const auto& bk : buckets_) n += params_sharded() && (bk.resident || bk.gathering) ? 1 : 0;
  return n;
}

size_t ShardedAdamW::grad_buckets_live() const {
  size_t n = 0;
  for (const auto& bk : buckets_) n += grads_sharded() && (bk.grads_live || bk.reducing) ? 1 : 0;
  return n;
}

}  // namespace moecore::optim
