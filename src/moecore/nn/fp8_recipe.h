// FP8 recipes as Megatron runs them through TransformerEngine (--fp8-format, --fp8-recipe): for each GEMM site (a
// Linear, one expert's projection) the scales of its three operands — input, weight, output gradient — and, under
// delayed scaling, their amax histories. The rounding itself is kernels/fp8.h; which GEMMs run in FP8 is decided
// here, once, while the model is built (Fp8ModelScope), so modules only ask for their site by parameter name.
#pragma once

#include <array>
#include <memory>
#include <string>
#include <vector>

#include "moecore/kernels/fp8.h"
#include "moecore/nn/tensor_parallel.h"

namespace moecore::nn {

enum class Fp8Recipe { Off, Delayed, Tensorwise, Blockwise };

// The resolved FP8 flags (train/config resolves them once).
struct Fp8Config {
  Fp8Recipe recipe = Fp8Recipe::Off;
  bool hybrid = false;  // --fp8-format hybrid: gradients in E5M2 (else everything E4M3)
  // Delayed scaling (TE DelayedScaling): scale = (max / amax) / 2^margin, amax over the last `history_len` amaxes
  // (max) or the latest one (most_recent).
  int64_t margin = 0;
  int64_t amax_history_len = 1;
  bool amax_max = false;
  // --first-last-layers-bf16: decoder layers [0, bf16_start) and [num_layers − bf16_end, num_layers) stay in bf16.
  int64_t num_layers = 0;
  int64_t bf16_start = 0, bf16_end = 0;
  // --fp8-param-gather: the sites' weights are FP8 parameters (fp8_param.h), taken by the GEMMs as they are.
  bool param_gather = false;
  bool on() const { return recipe != Fp8Recipe::Off; }
};
Fp8Recipe parse_fp8_recipe(const std::string& s);

enum class Fp8Operand { Input = 0, Weight = 1, Grad = 2 };

// One FP8 GEMM site. quantize() returns the operand rounded and read back in f32 (kernels/fp8.h), with the scale it
// used, so that backward can round the stashed input again with the same scale.
class Fp8Gemm {
 public:
  // `name` names the site in errors; per-tensor amaxes are reduced (max) over `tp` so a tensor-parallel shard is
  // scaled as the whole tensor is, as TE reduces amaxes over the tensor-parallel group.
  Fp8Gemm(const Fp8Config& cfg, std::string name, TPContext tp);

  // k_along_rows: the GEMM reduces over x's rows (a weight gradient's operands), which orients blockwise 1 × 128
  // tiles along columns of x (128 × 1). scale > 0 reuses that per-tensor scale (ignored by blockwise) and records
  // no amax; otherwise the recipe's scale is taken, and delayed scaling records x's amax.
  struct Quantized {
    Tensor q;  // f32, x's shape
    float scale = 0;
  };
  Quantized quantize(const Tensor& x, Fp8Operand op, bool k_along_rows, float scale = 0);

  kernels::Fp8Format format(Fp8Operand op) const;
  Fp8Recipe recipe() const { return cfg_.recipe; }
  // --fp8-param-gather: the weight this site multiplies is an FP8 parameter (fp8_param.h), already on its FP8 grid
  // with the scale the optimizer took, so the GEMMs take it as it is.
  bool weight_is_fp8_param() const { return cfg_.param_gather; }
  const TPContext& tp() const { return tp_; }
  // Delayed scaling: the scale operand `op`'s cast takes now; `amax` (the cast tensor's, reduced) then joins the
  // history and sets the next scale.
  float take_delayed_scale(Fp8Operand op, double amax);
  const std::string& name() const { return name_; }
  // Delayed scaling's state per operand (input, weight, grad): the scale the next quantize takes and the history,
  // newest first.
  std::array<float, 3> scales;
  std::array<std::vector<double>, 3> histories;

 private:
  Fp8Config cfg_;
  std::string name_;
  TPContext tp_;
  double checked_amax(const Tensor& x, Fp8Operand op) const;
};

// While one is alive (train/model_builder.cpp holds one around building the model), fp8_gemm_for gives the FP8
// sites; without one, or with the recipe off, there are none.
class Fp8ModelScope {
 public:
  explicit Fp8ModelScope(const Fp8Config& cfg);
  ~Fp8ModelScope();
  Fp8ModelScope(const Fp8ModelScope&) = delete;
  Fp8ModelScope& operator=(const Fp8ModelScope&) = delete;
};

// The FP8 site of the GEMM whose weight is `weight_name`, or null where it stays in higher precision: only the
// decoder's transformer layers ("decoder.layers.<i>.…") run FP8 GEMMs (not the output layer, embedding, router,
// or the multi-token-prediction block), and not the first/last layers kept in bf16.
std::shared_ptr<Fp8Gemm> fp8_gemm_for(const std::string& weight_name, TPContext tp);

}  // namespace moecore::nn
