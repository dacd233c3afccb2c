// Parameter registry and layout-independent initialization (see parameter.h).
#include "moecore/nn/parameter.h"

#include <algorithm>
#include <limits>

#include "moecore/core/rng.h"
#include "moecore/core/timers.h"
#include "moecore/kernels/backend.h"
#include "moecore/kernels/elementwise.h"

namespace moecore::nn {

ParamRegistry::ParamRegistry(DType dtype) : dtype_(dtype) {
  MOE_ASSERT_MSG(dtype == DType::F32 || dtype == DType::F64, "parameters are f32 (or f64 for checks), not {}",
                 dtype_name(dtype));
}

Parameter& ParamRegistry::add(const std::string& name, const Shape& shape, InitRule init, bool no_weight_decay) {
  for (auto& p : params_) MOE_ASSERT_MSG(p->name != name, "parameter {} registered twice", name);
  auto p = std::make_unique<Parameter>();
  p->name = name;
  p->value = meta_ ? Tensor::unallocated(shape, dtype_) : Tensor::zeros(shape, dtype_);
  p->grad = meta_ ? Tensor::unallocated(shape, dtype_) : Tensor::zeros(shape, dtype_);
  p->init = init;
  p->no_weight_decay = no_weight_decay;
  params_.push_back(std::move(p));
  return *params_.back();
}

Parameter& ParamRegistry::get(const std::string& name) {
  for (auto& p : params_)
    if (p->name == name) return *p;
  MOE_ASSERT_MSG(false, "no parameter named {}", name);
  return *params_.front();
}

int64_t ParamRegistry::numel() const {
  int64_t n = 0;
  for (auto& p : params_) n += p->value.numel();
  return n;
}

void ParamRegistry::initialize(uint64_t seed) {
  for (auto& p : params_)
    if (p->value.defined()) init_parameter(*p, seed);  // an unallocated one: by its shards' owners
}

void Parameter::set_shard(const Shape& global, const std::vector<int64_t>& offset, const Shape& box) {
  MOE_ASSERT_MSG(global.ndim() == box.ndim() && static_cast<int>(offset.size()) == box.ndim(),
                 "{}: shard box {} does not match global view {}", name, box.str(), global.str());
  MOE_ASSERT_MSG(box.numel() == value.numel(), "{}: shard box {} has a different size than {}", name, box.str(),
                 value.shape().str());
  for (int d = 0; d < box.ndim(); d++)
    MOE_ASSERT_MSG(offset[static_cast<size_t>(d)] >= 0 && offset[static_cast<size_t>(d)] + box[d] <= global[d],
                   "{}: shard box {} at dim {} offset {} exceeds global view {}", name, box.str(), d,
                   offset[static_cast<size_t>(d)], global.str());
  global_view = global;
  box_offset = offset;
  box_shape = box;
}

int64_t Parameter::global_index(int64_t i) const {
  if (!sharded()) return i;
  int64_t g = 0, stride = 1;
  for (int d = box_shape.ndim() - 1; d >= 0; d--) {
    const int64_t local = i % box_shape[d];
    i /= box_shape[d];
    g += (box_offset[static_cast<size_t>(d)] + local) * stride;
    stride *= global_view[d];
  }
  return g;
}

void init_parameter(Parameter& p, uint64_t seed) {
  if (!p.sharded() || p.init.kind != InitKind::Normal) {
    init_tensor(p.value, p.name, p.init, seed);
    return;
  }
  const Philox rng(seed, stream_id(p.name));
  const int64_t n = p.value.numel();
  const double std = p.init.std;
  MOE_DISPATCH_FLOAT(p.value.dtype(), T, {
    T* v = p.value.data<T>();
    _Pragma("omp parallel for schedule(static)") for (int64_t i = 0; i < n; i++) v[i] =
        static_cast<T>(std * rng.normal(static_cast<uint64_t>(p.global_index(i))));
  });
}

void init_parameter_range(const Parameter& p, uint64_t seed, int64_t first, Tensor& out) {
  const int64_t n = out.numel();
  MOE_ASSERT_MSG(first >= 0 && first + n <= p.value.numel(), "{}: elements [{}, {}) of {}", p.name, first, first + n,
                 p.value.numel());
  if (!p.sharded() || p.init.kind != InitKind::Normal) {  // a whole tensor's elements are its global ones
    init_tensor(out, p.name, p.init, seed, first);
    return;
  }
  const Philox rng(seed, stream_id(p.name));
  const double std = p.init.std;
  MOE_DISPATCH_FLOAT(out.dtype(), T, {
    T* v = out.data<T>();
    _Pragma("omp parallel for schedule(static)") for (int64_t i = 0; i < n; i++) v[i] =
        static_cast<T>(std * rng.normal(static_cast<uint64_t>(p.global_index(first + i))));
  });
}

namespace {
ParamRegistry::LazyZero g_lazy_zero = ParamRegistry::LazyZero::Lazy;
}  // namespace

void ParamRegistry::set_lazy_zero(LazyZero mode) {
  g_lazy_zero = mode;
}

void ParamRegistry::zero_grad(bool lazy) {
  for (auto& p : params_) {
    if (!p->grad.defined()) continue;  // unallocated (a freed FSDP unit's): its optimizer takes fresh gradients
    p->grad_stale = lazy && g_lazy_zero != LazyZero::Eager && kernels::backend_offers(p->grad.device()).lazy_grad_zero;
    if (!p->grad_stale)
      p->grad.zero_();
    else if (g_lazy_zero == LazyZero::Poisoned)
      kernels::fill_(p->grad, std::numeric_limits<double>::quiet_NaN());
  }
}

void ParamRegistry::settle_grads() {
  for (auto& p : params_) p->settle_grad();
}

void ParamRegistry::to(Device d) {
  for (auto& p : params_) {
    if (!p->value.defined()) continue;  // unallocated (set_meta): its shards are made where the optimizer lives
    p->settle_grad();
    p->value = p->value.to(d);
    p->grad = p->grad.to(d);
    p->low_cache = Tensor();
    p->low_cache_valid = p->low_cache_from_update = false;
  }
  device_ = d;
}

namespace {
// Whether the bf16 copy the optimizer wrote still rounds p.value, at 64 elements spread over it.
bool bf16_copy_matches(const Parameter& p) {
  const int64_t n = p.value.numel();
  // Only a backend whose update writes the copy keeps it (kernels/backend.h); its tensors are on the host.
  if (!p.low_cache.defined() || p.low_cache.numel() != n || p.low_cache.dtype() != DType::BF16 ||
      p.value.dtype() != DType::F32 || !kernels::backend_offers(p.value.device()).update_writes_bf16_copy ||
      !kernels::backend_offers(p.low_cache.device()).update_writes_bf16_copy)
    return false;
  const float* v = p.value.data<float>();
  const bf16* c = p.low_cache.data<bf16>();
  constexpr int64_t kSamples = 64;
  for (int64_t s = 0; s < std::min(n, kSamples); s++) {
    const int64_t i = n <= kSamples ? s : s * (n - 1) / (kSamples - 1);
    if (float_to_bf16(v[i]).bits != c[i].bits) return false;
  }
  return true;
}
}  // namespace

Bf16WeightScope::Bf16WeightScope(ParamRegistry& reg, bool pack) : reg_(reg) {
  for (auto& p : reg_.all()) {
    p->low_cache_enabled = true;
    p->pack_enabled = pack;
    if (is_half(p->value.dtype())) p->low_cache = Tensor();  // the value itself is the copy
    p->low_cache_valid = p->low_cache_from_update && bf16_copy_matches(*p);
    p->low_cache_from_update = false;  // good for this scope only: the next needs the next update's copy
    p->packed_valid.assign(p->packed_valid.size(), false);
  }
}

Bf16WeightScope::~Bf16WeightScope() {
  for (auto& p : reg_.all()) {
    p->low_cache_enabled = p->low_cache_valid = p->pack_enabled = false;
    p->packed_valid.assign(p->packed_valid.size(), false);
  }
}

Tensor low_weights(Parameter& p, DType low) {
  MOE_ASSERT(is_half(low));
  if (p.value.dtype() == low) return p.value;  // stored in bf16 (f16): the optimizer's master rounded
  TimerScope timer("weight-cast", 2);
  if (!p.low_cache_enabled) return p.value.to(low);
  if (!p.low_cache_valid || p.low_cache.dtype() != low) {
    if (!p.low_cache.defined() || p.low_cache.dtype() != low)
      p.low_cache = Tensor::empty(p.value.shape(), low, p.value.device());
    p.low_cache.copy_from(p.value);
    p.low_cache_valid = true;
  }
  return p.low_cache;
}

kernels::PackedWeight packed_bf16_weight(Parameter& p, const Tensor& w_bf16, int64_t slice, bool trans, int64_t m) {
  if (!p.low_cache_enabled || !p.pack_enabled) return kernels::PackedWeight{w_bf16, trans, Tensor(), -1};
  const size_t i = static_cast<size_t>(slice * 2 + (trans ? 1 : 0));
  if (p.packed_cache.size() <= i) {
    p.packed_cache.resize(i + 1);
    p.packed_valid.resize(i + 1, false);
  }
  if (!p.packed_valid[i]) {
    TimerScope timer("weight-cast", 2);
    kernels::pack_weight(w_bf16, trans, m, p.packed_cache[i]);
    p.packed_valid[i] = true;
  }
  return p.packed_cache[i];
}

void pack_grads(const std::vector<Parameter*>& params, Tensor& flat) {
  int64_t off = 0;
  for (auto* p : params) {
    MOE_ASSERT(p->grad.dtype() == flat.dtype() && off + p->grad.numel() <= flat.numel());
    p->settle_grad();  // a gradient no backward wrote this step is zero
    flat.reshape({flat.numel()}).slice(off, p->grad.numel()).copy_from(p->grad);
    off += p->grad.numel();
  }
}

void unpack_grads(const Tensor& flat, const std::vector<Parameter*>& params) {
  int64_t off = 0;
  for (auto* p : params) {
    MOE_ASSERT(p->grad.dtype() == flat.dtype() && off + p->grad.numel() <= flat.numel());
    p->grad.copy_from(flat.reshape({flat.numel()}).slice(off, p->grad.numel()));
    off += p->grad.numel();
  }
}

void init_tensor(Tensor& t, const std::string& name, InitRule rule, uint64_t seed, int64_t offset) {
  switch (rule.kind) {
    case InitKind::Zeros:
      kernels::fill_(t, 0.0);
      return;
    case InitKind::Ones:
      kernels::fill_(t, 1.0);
      return;
    case InitKind::Normal:
      break;
  }
  const Philox rng(seed, stream_id(name));
  const int64_t n = t.numel();
  MOE_DISPATCH_FLOAT(t.dtype(), T, {
    T* p = t.data<T>();
    _Pragma("omp parallel for schedule(static)") for (int64_t i = 0; i < n; i++) p[i] =
        static_cast<T>(rule.std * rng.normal(static_cast<uint64_t>(offset + i)));
  });
}

}  // namespace moecore::nn
