// Norm module (see norm.h).
#include "moecore/nn/norm.h"

#include "moecore/kernels/elementwise.h"
#include "moecore/kernels/layernorm.h"
#include "moecore/kernels/rmsnorm.h"
#include "moecore/nn/stash_bytes.h"

namespace moecore::nn {

NormKind parse_norm_kind(std::string_view s) {
  if (s == "RMSNorm") return NormKind::RMSNorm;
  MOE_CHECK(s == "LayerNorm", "--normalization {} is not supported; use LayerNorm or RMSNorm", s);
  return NormKind::LayerNorm;
}

Norm::Norm(ParamRegistry& reg, const std::string& name, int64_t dim, const NormConfig& cfg) : cfg_(cfg) {
  weight_ = &reg.add(name + ".weight", {dim}, cfg.zero_centered_gamma ? InitRule::zeros() : InitRule::ones(),
                     /*no_weight_decay=*/true);
  if (cfg.kind == NormKind::LayerNorm) bias_ = &reg.add(name + ".bias", {dim}, InitRule::zeros(), true);
}

const Tensor& Norm::gamma() {
  if (!cfg_.zero_centered_gamma) return weight_->value;
  // d(1 + w)/dw = 1, so the kernels' weight gradient is the parameter's.
  if (!gamma_.defined() || gamma_.dtype() != weight_->value.dtype())
    gamma_ = Tensor::empty(weight_->value.shape(), weight_->value.dtype(), weight_->value.device());
  kernels::fill_(gamma_, 1.0);
  kernels::add_(gamma_, weight_->value);
  return gamma_;
}

Tensor Norm::forward(const Tensor& x, Stash& st, std::optional<DType> out) {
  Tensor in = x;  // not written: no residual
  return forward_impl(in, nullptr, st, out);
}

Tensor Norm::forward_add(Tensor& x, const Tensor& residual, Stash& st, std::optional<DType> out) {
  return forward_impl(x, &residual, st, out);
}

Tensor Norm::forward_impl(Tensor& x, const Tensor* residual, Stash& st, std::optional<DType> out) {
  st.dtype = x.dtype();
  // low_stash: the norm reads its input rounded to bf16, as Megatron's norms read their bf16 activations, so that
  // forward, backward and a recompute (--recompute-modules layernorm) all see the one rounding the stash keeps; the
  // f32 rows (with a residual: the sum, written into x) stay the residual stream's and are not kept.
  Tensor in = x;
  const Tensor* res = residual;
  if (cfg_.low_stash && x.dtype() == DType::F32) {
    if (residual) kernels::add_(x, *residual);
    res = nullptr;
    st.x = x.as_dtype(*cfg_.low_stash);
    in = st.x.as_dtype(DType::F32);
  } else {
    st.x = x;
  }
  st.rstd = Tensor::empty({x.rows()}, x.dtype(), x.device());
  Tensor y = Tensor::empty(x.shape(), out.value_or(x.dtype()), x.device());
  if (cfg_.kind == NormKind::LayerNorm) {
    st.mean = Tensor::empty({x.rows()}, x.dtype(), x.device());
    if (res)
      kernels::layernorm_forward_add(in, *res, gamma(), bias_->value, cfg_.eps, y, st.mean, st.rstd);
    else
      kernels::layernorm_forward(in, gamma(), bias_->value, cfg_.eps, y, st.mean, st.rstd);
  } else if (res) {
    kernels::rmsnorm_forward_add(in, *res, gamma(), cfg_.eps, y, st.rstd);
  } else {
    kernels::rmsnorm_forward(in, gamma(), cfg_.eps, y, st.rstd);
  }
  return y;
}

Tensor Norm::backward(const Tensor& dy, Stash& st, const Tensor* dres) {
  Tensor dx = Tensor::empty(st.x.shape(), st.dtype, st.x.device());
  const Tensor dy_x = dy.reshape(st.x.shape());
  if (cfg_.kind == NormKind::LayerNorm)
    kernels::layernorm_backward(dy_x, st.x, gamma(), st.mean, st.rstd, dx, weight_->grad_to_add(), bias_->grad_to_add(),
                                dres);
  else
    kernels::rmsnorm_backward(dy_x, st.x, gamma(), st.rstd, dx, weight_->grad_to_add(), dres);
  st = Stash{};
  return dx;
}

// What Norm::forward keeps beyond its input st.x: the statistics (stash_bytes.h).
int64_t norm_stash_bytes(int64_t rows, NormKind kind) {
  // The statistics stay f32 under --bf16 (Megatron's norms keep theirs in f32 too).
  return tensor_bytes(rows, DType::F32) * (kind == NormKind::LayerNorm ? 2 : 1);
}

}  // namespace moecore::nn
