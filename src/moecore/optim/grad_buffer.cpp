// Parameter-and-gradient buffers (see grad_buffer.h).
#include "moecore/optim/grad_buffer.h"

#include <algorithm>

namespace moecore::optim {

DType storage_dtype(const nn::Parameter& p) {
  return p.low_storage && p.math_dtype() == DType::F32 ? *p.low_storage : p.value.dtype();
}

namespace {
// The layer buckets in the order their gradients become final: the last layer first, the embedding and output
// layer (num_layers) last.
std::vector<size_t> final_order(size_t num_layers) {
  std::vector<size_t> order;
  for (size_t l = num_layers; l-- > 0;) order.push_back(l);
  order.push_back(num_layers);
  return order;
}

void bind(BufferBucket& bk, const BufferLayout& o) {
  bk.padded = (bk.numel + o.shards - 1) / o.shards * o.shards;
  bk.pending = bk.layers.size();
  if (o.layout_only) return;
  const DType gt = bk.params.front()->grad.dtype();  // f32 (f64 in checks)
  bk.grad = Tensor::zeros({bk.padded}, gt, o.device);
  if (o.param_buffers) bk.param = Tensor::zeros({bk.padded}, bk.storage, o.device);
  for (size_t i = 0; i < bk.params.size(); i++) {
    nn::Parameter& p = *bk.params[i];
    const int64_t n = p.value.numel();
    MOE_ASSERT_MSG(p.grad.dtype() == gt, "{}: a {} gradient in a {} bucket", p.name, dtype_name(p.grad.dtype()),
                   dtype_name(gt));
    p.settle_grad();
    Tensor g = bk.grad.slice(bk.offsets[i], n).reshape(p.grad.shape());
    g.copy_from(p.grad);
    p.grad = g;
    if (o.param_buffers) {
      Tensor v = bk.param.slice(bk.offsets[i], n).reshape(p.value.shape());
      v.copy_from(p.value);  // rounded to bf16 where stored so
      p.value = v;
    }
  }
  bk.pending = bk.layers.size();
}
}  // namespace

std::vector<BufferBucket> make_buckets(const std::vector<nn::Parameter*>& params, const BufferLayout& o) {
  MOE_ASSERT(o.shards >= 1);
  std::vector<std::pair<DType, bool>> kinds = {{DType::F32, false}};
  if (o.param_buffers)
    kinds = {{DType::BF16, false}, {DType::F16, false}, {DType::F32, false}, {DType::F64, false}, {DType::F32, true}};
  std::vector<BufferBucket> out;
  for (const auto& [kind, fp8] : kinds) {
    // This storage dtype's parameters by layer bucket, in registry order within a layer.
    std::vector<std::vector<nn::Parameter*>> by_layer(o.num_layers + 1);
    for (auto* p : params) {
      if (o.param_buffers && (storage_dtype(*p) != kind || (p->fp8 != nullptr) != fp8)) continue;
      const size_t b = o.bucket_of ? o.bucket_of(*p) : o.num_layers;
      MOE_ASSERT_MSG(b <= o.num_layers, "{}: bucket {} of {}", p->name, b, o.num_layers + 1);
      by_layer[b].push_back(p);
    }
    auto add = [&](BufferBucket& bk, nn::Parameter* p) {
      bk.params.push_back(p);
      bk.offsets.push_back(bk.numel);
      bk.numel += p->value.numel();
    };
    std::vector<BufferBucket> mine;
    if (o.bucket_size <= 0) {  // one bucket per layer bucket, in layer order
      for (size_t l = 0; l <= o.num_layers; l++) {
        if (by_layer[l].empty()) continue;
        BufferBucket bk;
        bk.storage = kind;
        bk.fp8 = fp8;
        bk.layers = {l};
        for (auto* p : by_layer[l]) add(bk, p);
        mine.push_back(std::move(bk));
      }
    } else {  // Megatron's: filled in the order gradients become final, closed at a parameter boundary once full
      BufferBucket bk;
      bk.storage = kind;
      bk.fp8 = fp8;
      for (const size_t l : final_order(o.num_layers)) {
        for (auto* p : by_layer[l]) {
          if (bk.layers.empty() || bk.layers.back() != l) bk.layers.push_back(l);
          add(bk, p);
          if (bk.numel >= o.bucket_size) {
            mine.push_back(std::move(bk));
            bk = BufferBucket();
            bk.storage = kind;
            bk.fp8 = fp8;
          }
        }
      }
      if (!bk.params.empty()) mine.push_back(std::move(bk));
    }
    for (auto& bk : mine) {
      bind(bk, o);
      out.push_back(std::move(bk));
    }
  }
  return out;
}

std::vector<size_t> complete_buckets(std::vector<BufferBucket>& buckets, size_t layer) {
  std::vector<size_t> done;
  for (size_t i = 0; i < buckets.size(); i++) {
    BufferBucket& bk = buckets[i];
    if (std::find(bk.layers.begin(), bk.layers.end(), layer) == bk.layers.end()) continue;
    MOE_ASSERT_MSG(bk.pending > 0, "layer {} reported final twice in one step", layer);
    if (--bk.pending == 0) done.push_back(i);
  }
  return done;
}

void reset_pending(std::vector<BufferBucket>& buckets) {
  for (auto& bk : buckets) bk.pending = bk.layers.size();
}

}  // namespace moecore::optim
