// Linear (see linear.h). With y = x·Wᵀ + b:  dx = dy·W,  dW += dyᵀ·x,  db += Σ_rows dy.
#include "moecore/nn/linear.h"

#include "moecore/core/allocator.h"
#include "moecore/kernels/elementwise.h"
#include "moecore/kernels/gemm.h"
#include "moecore/nn/fp8_gemm.h"
#include "moecore/nn/fp8_param.h"
#include "moecore/nn/stash_bytes.h"

namespace moecore::nn {

Linear::Linear(ParamRegistry& reg, const std::string& name, const LinearConfig& cfg)
    : in_(cfg.in), out_(cfg.out), low_(cfg.low) {
  MOE_ASSERT(cfg.in > 0 && cfg.out > 0);
  const int64_t P = cfg.tp.size(), r = cfg.tp.rank();
  const TPSplit split = cfg.tp.on() ? cfg.split : TPSplit::None;
  if (split == TPSplit::Column) {
    const int64_t halves = cfg.gated ? 2 : 1;
    MOE_CHECK(cfg.out % (halves * P) == 0, "{}: {} output features do not split over {} tensor-parallel ranks", name,
              cfg.out, P);
    out_ = cfg.out / P;
  } else if (split == TPSplit::Row) {
    MOE_CHECK(cfg.in % P == 0, "{}: {} input features do not split over {} tensor-parallel ranks", name, cfg.in, P);
    MOE_ASSERT_MSG(!cfg.bias, "{}: a row-parallel bias is added after the reduction, not here", name);
    in_ = cfg.in / P;
  }
  weight_ = &reg.add(name + ".weight", {out_, in_}, cfg.init);
  weight_->low_storage = cfg.low;  // read only by the bf16/f16 GEMMs below (low_weights)
  if (cfg.bias) bias_ = &reg.add(name + ".bias", {out_}, InitRule::zeros(), /*no_weight_decay=*/true);
  if (cfg.gated) {  // seen as [2, F, in] whatever the split, so every layout's checkpoint has the same view
    MOE_ASSERT(split != TPSplit::Row && cfg.out % 2 == 0);
    const int64_t half = cfg.out / 2, h = out_ / 2;
    weight_->set_shard({2, half, cfg.in}, {0, r * h, 0}, {2, h, cfg.in});
    if (bias_) bias_->set_shard({2, half}, {0, r * h}, {2, h});
  } else if (split == TPSplit::Column) {
    weight_->set_shard({cfg.out, cfg.in}, {r * out_, 0}, {out_, cfg.in});
    if (bias_) bias_->set_shard({cfg.out}, {r * out_}, {out_});
  } else if (split == TPSplit::Row) {
    weight_->set_shard({cfg.out, cfg.in}, {0, r * in_}, {cfg.out, in_});
  }
  weight_->tensor_parallel = split != TPSplit::None;
  if (bias_) bias_->tensor_parallel = weight_->tensor_parallel;
  MOE_ASSERT_MSG(!low_ || reg.dtype() == DType::F32, "bf16 GEMMs need f32 master weights");
  fp8_ = fp8_gemm_for(weight_->name, cfg.tp);
  if (fp8_) make_fp8_param(*weight_, {fp8_}, out_, in_);  // --fp8-param-gather: the weight held as FP8
}

Linear::Linear(Parameter& weight, LowPrecision low)
    : weight_(&weight), in_(weight.value.dim(1)), out_(weight.value.dim(0)), low_(low) {}

Tensor Linear::forward(const Tensor& x, Stash& st, DType out) {
  MOE_ASSERT_MSG(x.cols() == in_, "{} expects inputs with {} features, got {}", weight_->name, in_, x.shape().str());
  MOE_ASSERT_MSG(low_ || !is_half(x.dtype()), "{}: a bf16 or f16 input to an f32 GEMM", weight_->name);
  const Tensor x2 = x.reshape({x.rows(), in_});
  const Tensor& w = weight_->value;
  const bool y16 = is_half(out);
  MOE_ASSERT_MSG(!y16 || out == low_, "{}: a {} output from {} GEMMs", weight_->name, dtype_name(out),
                 dtype_name(low_.value_or(DType::F32)));
  if (fp8_) {  // operands cast as TE casts them: from bf16 under --bf16
    st.x = low_ ? x2.as_dtype(*low_) : x2;
    Tensor y = Tensor::empty({x2.rows(), out_}, DType::F32, x2.device());
    st.fp8_x_scale = fp8_forward(*fp8_, st.x, low_ && !weight_->fp8 ? low_weights(*weight_, *low_) : w, y, w_fp8_);
    if (bias_) kernels::add_row_bias_(y, bias_->value);
    return y16 ? y.to(out) : y;
  }
  MOE_ASSERT_MSG(!y16 || (low_ && !bias_ && x2.device().is_cpu()), "{}: a bf16 output needs bf16 GEMMs, no bias, CPU",
                 weight_->name);
  Tensor y = Tensor::empty({x2.rows(), out_}, y16 ? out : weight_->math_dtype(), x2.device());
  if (low_) {
    w_low_ = low_weights(*weight_, *low_);
    st.x = x2.as_dtype(*low_);
    kernels::gemm(st.x, false, w_low_, true, y);
  } else {
    st.x = x2;
    kernels::gemm(st.x, false, w, true, y);
  }
  if (bias_) kernels::add_row_bias_(y, bias_->value);
  return y;
}

void Linear::stash_input(const Tensor& x, Stash& st) const {
  const Tensor x2 = x.reshape({x.rows(), in_});
  st.x = low_ ? x2.as_dtype(*low_) : x2;
}

Tensor Linear::backward(const Tensor& dy, Stash& st, DType dx_out) {
  MOE_ASSERT(dy.cols() == out_ && dy.rows() == st.x.rows());
  const bool dx16 = is_half(dx_out);
  MOE_ASSERT_MSG(!dx16 || (dx_out == low_ && dy.device().is_cpu()),
                 "{}: a bf16 input gradient needs bf16 GEMMs on the CPU", weight_->name);
  Tensor dx = Tensor::empty({dy.rows(), in_}, dx16 ? dx_out : weight_->math_dtype(), dy.device());
  backward_into(dy, st, dx, 0.0f);
  return dx;
}

void Linear::backward_add(const Tensor& dy, Stash& st, Tensor& dx) {
  MOE_ASSERT(dy.cols() == out_ && dy.rows() == st.x.rows());
  MOE_ASSERT_MSG(dx.rows() == dy.rows() && dx.cols() == in_ && dx.dtype() == weight_->math_dtype(),
                 "{}: input gradient {} {} to add to", weight_->name, dx.shape().str(), dtype_name(dx.dtype()));
  backward_into(dy, st, dx, 1.0f);
}

void Linear::backward_into(const Tensor& dy, Stash& st, Tensor& dx, float beta) {
  MOE_ASSERT_MSG(low_ || !is_half(dy.dtype()), "{}: a bf16 or f16 gradient to an f32 GEMM", weight_->name);
  const Tensor dy2 = dy.reshape({dy.rows(), out_});
  const float grad_beta = weight_->take_grad_beta();  // 0: the step's first write of a stale gradient
  if (fp8_) {
    fp8_backward(*fp8_, low_ ? dy2.as_dtype(*low_) : dy2, st.x, st.fp8_x_scale, w_fp8_, dx, beta, weight_->grad,
                 grad_beta);
  } else if (low_) {
    const Tensor dyb = dy2.as_dtype(*low_);
    kernels::gemm(dyb, false, w_low_, false, dx, 1.0f, beta);
    kernels::gemm(dyb, true, st.x, false, weight_->grad, 1.0f, grad_beta);
  } else {
    kernels::gemm(dy2, false, weight_->value, false, dx, 1.0f, beta);
    kernels::gemm(dy2, true, st.x, false, weight_->grad, 1.0f, grad_beta);
  }
  if (bias_) kernels::accumulate_col_sums(dy2, bias_->grad_to_add());
  st.x = Tensor();
}

int64_t tensor_bytes(int64_t numel, DType dt) {
  return numel > 0 ? static_cast<int64_t>(Allocator::round_size(static_cast<size_t>(numel) * dtype_size(dt))) : 0;
}

// What Linear::forward / stash_input keep in st.x beyond the caller's tensor (stash_bytes.h).
int64_t linear_stash_bytes(int64_t rows, int64_t in, LowPrecision low) {
  return low ? tensor_bytes(rows * in, *low) : 0;
}

}  // namespace moecore::nn
