// The normalization every norm slot uses (input_layernorm, pre_mlp_layernorm, final_layernorm, q/k_layernorm):
// RMSNorm or LayerNorm by configuration (Megatron's --normalization), over the last dimension. Weight init ones
// (zeros with zero-centred gamma, Megatron's --apply-layernorm-1p: the scale is 1 + weight), LayerNorm's bias
// zeros; both excluded from weight decay as Megatron's 1-D parameters are. Parameters are `name.weight` and, for
// LayerNorm, `name.bias`, replicated over tensor parallelism (their gradients are summed over TP under sequence
// parallelism, as for every replicated parameter: see parameter.h).
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "moecore/nn/parameter.h"

namespace moecore::nn {

enum class NormKind { RMSNorm, LayerNorm };
// "RMSNorm" or "LayerNorm" (Megatron's spelling); anything else is refused.
NormKind parse_norm_kind(std::string_view s);

struct NormConfig {
  NormKind kind = NormKind::RMSNorm;
  double eps = 1e-5;
  bool zero_centered_gamma = false;
  // --bf16 (--fp16): the norm reads its f32 input rounded to bf16 (f16) and keeps that rounding for backward (as
  // Megatron's norms read and keep their bf16 or fp16 activations); backward reads it widened. The statistics and dx
  // stay f32.
  LowPrecision low_stash{};
};

class Norm {
 public:
  struct Stash {
    Tensor x, mean, rstd;      // x: the input (bf16 or f16 with low_stash); mean: LayerNorm only
    DType dtype = DType::F32;  // the input's own dtype: of dx
  };
  Norm(ParamRegistry& reg, const std::string& name, int64_t dim, const NormConfig& cfg);
  // x [..., dim] -> y (same shape), of x's dtype or `out`: BF16 for an f32 x rounds y as it is written, the cast a
  // bf16 GEMM reading y would otherwise make in a pass of its own.
  Tensor forward(const Tensor& x, Stash& st, std::optional<DType> out = std::nullopt);
  // The residual add before the norm fused into it: x += residual (x is written, and kept as the norm's input),
  // then forward(x). One pass over each row; the same bits as add_ and forward.
  Tensor forward_add(Tensor& x, const Tensor& residual, Stash& st, std::optional<DType> out = std::nullopt);
  // dy -> dx. dres: the gradient of a residual branch beside the norm, added to dx as it is written (the same bits
  // as an add_ after).
  Tensor backward(const Tensor& dy, Stash& st, const Tensor* dres = nullptr);
  // The input forward kept, in its own dtype (widened from bf16 or f16 under low_stash): what a recompute of the norm's
  // output (--recompute-modules layernorm) normalizes again.
  static Tensor kept_input(const Stash& st) { return st.x.as_dtype(st.dtype); }

 private:
  // The scale the kernels apply: the weight, or 1 + weight with zero-centred gamma.
  const Tensor& gamma();
  Tensor forward_impl(Tensor& x, const Tensor* residual, Stash& st, std::optional<DType> out);
  NormConfig cfg_;
  Parameter* weight_;
  Parameter* bias_ = nullptr;
  Tensor gamma_;  // 1 + weight, refreshed by gamma() (zero-centred gamma only)
};

}  // namespace moecore::nn
