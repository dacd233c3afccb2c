// FP8 parameters in the distributed optimizer (--fp8-param-gather; see distributed_optimizer.h), as Megatron's
// quantize_param_shard and TE's cast_master_weights_to_fp8: after each step every rank casts the masters it owns,
// with the scales of the whole tensors (each rank's partial amaxes reduced, max, over the group), and the FP8
// bytes, not the values, are all-gathered: one byte per element (packed four to an i32 word, each rank's part
// padded to whole words), read back as code · scale_inv with the scales every rank holds.
#include <cstring>
#include <map>

#include "moecore/nn/fp8_param.h"
#include "moecore/optim/distributed_optimizer.h"

namespace moecore::optim {

namespace {
int64_t words(int64_t bytes) {
  return (bytes + 3) / 4;
}
uint8_t* bytes_of(Tensor& t) {
  return reinterpret_cast<uint8_t*>(t.data<int32_t>());
}
// `len` bytes from each rank of g (its words in `mine`), one after another in rank order.
Tensor gather_bytes(const comm::ProcessGroup& g, const Tensor& mine, int64_t len) {
  Tensor all = Tensor::empty({mine.numel() * g.size()}, DType::I32);
  g.all_gather(mine, all);
  Tensor out = Tensor::zeros({words(len * g.size())}, DType::I32);
  for (int64_t r = 0; r < g.size(); r++)
    std::memcpy(bytes_of(out) + r * len, bytes_of(all) + r * mine.numel() * 4, len);
  return out;
}
}  // namespace

void ShardedAdamW::cast_fp8() {
  // Each FP8 parameter's amax slots, laid end to end over the FP8 buckets in order (the same on every rank).
  std::map<const nn::Parameter*, int64_t> first_slot;
  int64_t slots = 0;
  for (const auto& bk : buckets_)
    if (bk.buf.fp8)
      for (const auto& s : bk.segs) {
        first_slot[s.p] = slots;
        slots += s.p->fp8->amax_slots();
      }
  if (slots == 0) return;
  MOE_ASSERT_MSG(master_.device().is_cpu(), "FP8 parameters are CPU-only");
  Tensor amax = Tensor::zeros({slots}, DType::F64);
  const float* master = master_.data<float>();
  for (const auto& bk : buckets_) {
    if (!bk.buf.fp8) continue;
    for_owned(bk, [&](const Segment& s, int64_t /*off*/, int64_t len, int64_t at) {
      s.p->fp8->add_amax(master + bk.master + at - state_lo(bk), at - s.offset, len,
                         amax.data<double>() + first_slot[s.p]);
    });
  }
  group_.all_reduce(amax, comm::ReduceOp::Max);  // the whole tensors' (a shard boundary may split a block)
  if (outer_) inter_->all_reduce(amax, comm::ReduceOp::Max);
  for (const auto& bk : buckets_) {
    if (!bk.buf.fp8) continue;
    for (const auto& s : bk.segs) {
      const double* a = amax.data<double>() + first_slot[s.p];
      s.p->fp8->set_scales(std::vector<double>(a, a + s.p->fp8->amax_slots()));
    }
  }
  for (auto& bk : buckets_) {
    if (!bk.buf.fp8) continue;
    const int64_t len = state_len(bk), state = state_lo(bk);
    Tensor mine = Tensor::zeros({words(len)}, DType::I32);
    for_owned(bk, [&](const Segment& s, int64_t /*off*/, int64_t n, int64_t at) {
      s.p->fp8->encode(master + bk.master + at - state, at - s.offset, n, bytes_of(mine) + at - state);
    });
    // With the state split over the instances too, the shard's bytes from its owners (one byte per element).
    bk.codes = outer_ ? gather_bytes(*inter_, mine, len) : mine;
    const uint8_t* codes = bytes_of(bk.codes);
    float* values = bk.param_shard.data<float>();
    for_range(bk, lo(bk), bk.shard, [&](const Segment& s, int64_t rel, int64_t n, int64_t at) {
      s.p->fp8->decode(codes + rel, at - s.offset, n, values + rel);
    });
  }
}

void ShardedAdamW::gather_fp8(Bucket& bk) {
  bk.codes_all = Tensor::empty({bk.codes.numel() * group_.size()}, DType::I32);
  group_.all_gather(bk.codes, bk.codes_all);
  decode_gathered(bk);
}

void ShardedAdamW::decode_gathered(Bucket& bk) {
  const int64_t per_rank = bk.codes.numel() * 4;  // bytes of each rank's part, padded to words
  float* values = bk.buf.param.data<float>();
  for (int64_t r = 0; r < group_.size(); r++) {
    const uint8_t* codes = bytes_of(bk.codes_all) + r * per_rank;
    for_range(bk, r * bk.shard, bk.shard, [&](const Segment& s, int64_t rel, int64_t n, int64_t at) {
      s.p->fp8->decode(codes + rel, at - s.offset, n, values + at);
    });
  }
  bk.codes_all = Tensor();
}

}  // namespace moecore::optim
