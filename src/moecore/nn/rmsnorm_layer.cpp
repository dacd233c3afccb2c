// RMSNorm module (see rmsnorm.h).
#include "moecore/nn/rmsnorm_layer.h"

#include "moecore/kernels/rmsnorm.h"

namespace moecore::nn {

RMSNorm::RMSNorm(ParamRegistry& reg, const std::string& name, int64_t dim, double eps) : eps_(eps) {
  weight_ = &reg.add(name + ".weight", {dim}, InitRule::ones(), /*no_weight_decay=*/true);
}

Tensor RMSNorm::forward(const Tensor& x, Stash& st) {
  st.x = x;
  st.rstd = Tensor::empty({x.rows()}, x.dtype(), x.device());
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  kernels::rmsnorm_forward(x, weight_->value, eps_, y, st.rstd);
  return y;
}

Tensor RMSNorm::backward(const Tensor& dy, Stash& st) {
  Tensor dx = Tensor::empty(st.x.shape(), st.x.dtype(), st.x.device());
  kernels::rmsnorm_backward(dy.reshape(st.x.shape()), st.x, weight_->value, st.rstd, dx, weight_->grad_to_add());
  st = Stash{};
  return dx;
}

}  // namespace moecore::nn
