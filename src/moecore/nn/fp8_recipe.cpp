// FP8 recipe state (see fp8_recipe.h). Scales follow TransformerEngine's recipes: Float8CurrentScaling
// (tensorwise) scale = max / amax of the tensor being cast; DelayedScaling scale = (max / amax_h) / 2^margin with
// amax_h from the history of earlier casts, updated after each cast (a step's micro-batches each update it, as
// each of Megatron's micro-batch forwards closes its own fp8_autocast); Float8BlockScaling power-of-two scales per
// 1 × 128 tile (activations, gradients) or 128 × 128 block (weights).
#include "moecore/nn/fp8_recipe.h"

#include <cmath>

#include "moecore/core/error.h"

namespace moecore::nn {

namespace {

Fp8Config g_cfg;       // the live Fp8ModelScope's config
bool g_scope = false;  // whether one is alive

const char* operand_name(Fp8Operand op) {
  switch (op) {
    case Fp8Operand::Input:
      return "input";
    case Fp8Operand::Weight:
      return "weight";
    case Fp8Operand::Grad:
      return "output gradient";
  }
  return "?";
}

constexpr int64_t kBlock = 128;

}  // namespace

Fp8Recipe parse_fp8_recipe(const std::string& s) {
  if (s == "delayed") return Fp8Recipe::Delayed;
  if (s == "tensorwise") return Fp8Recipe::Tensorwise;
  if (s == "blockwise") return Fp8Recipe::Blockwise;
  MOE_CHECK(false, "--fp8-recipe {}: use delayed, tensorwise or blockwise", s);
  return Fp8Recipe::Off;
}

Fp8Gemm::Fp8Gemm(const Fp8Config& cfg, std::string name, TPContext tp) : cfg_(cfg), name_(std::move(name)), tp_(tp) {
  MOE_ASSERT(cfg.on() && cfg.amax_history_len >= 1);
  scales.fill(1.0f);  // TE's initial delayed scale
}

kernels::Fp8Format Fp8Gemm::format(Fp8Operand op) const {
  return cfg_.hybrid && op == Fp8Operand::Grad ? kernels::Fp8Format::E5M2 : kernels::Fp8Format::E4M3;
}

// The tensor's amax over the TP group; a NaN or infinity anywhere in the group is an error on every rank, naming the
// site and the operand (a scale from it would turn the whole tensor into garbage).
double Fp8Gemm::checked_amax(const Tensor& x, Fp8Operand op) const {
  double amax = kernels::fp8_amax(x);
  const bool local_bad = !std::isfinite(amax);
  if (tp_.on()) {
    Tensor buf = Tensor::empty({1}, DType::F64);
    buf.data<double>()[0] = local_bad ? INFINITY : amax;
    tp_.group->all_reduce(buf, comm::ReduceOp::Max);
    amax = buf.data<double>()[0];
  }
  MOE_CHECK(std::isfinite(amax),
            "FP8 GEMM {}: its {} holds {} values ({} on this rank), so it has no FP8 scale; the run has diverged: "
            "lower --lr, clip gradients (--clip-grad) or resume from an earlier checkpoint",
            name_, operand_name(op), local_bad ? (std::isnan(kernels::fp8_amax(x)) ? "NaN" : "infinite") : "non-finite",
            local_bad ? "found" : "not");
  return amax;
}

Fp8Gemm::Quantized Fp8Gemm::quantize(const Tensor& x, Fp8Operand op, bool k_along_rows, float scale) {
  const kernels::Fp8Format f = format(op);
  Quantized out{Tensor::empty(x.shape(), DType::F32, x.device()), 0.0f};
  if (cfg_.recipe == Fp8Recipe::Blockwise) {
    // Block scales come from each block alone: a finite check of the whole (no reduction: blocks of a 128-aligned
    // shard are blocks of the whole tensor).
    const double amax = kernels::fp8_amax(x);
    MOE_CHECK(std::isfinite(amax), "FP8 GEMM {}: its {} holds {} values, so it has no FP8 scale; the run has diverged",
              name_, operand_name(op), std::isnan(amax) ? "NaN" : "infinite");
    const int64_t br = op == Fp8Operand::Weight ? kBlock : (k_along_rows ? kBlock : 1);
    const int64_t bc = op == Fp8Operand::Weight ? kBlock : (k_along_rows ? 1 : kBlock);
    kernels::fp8_quantize_blockwise(x, f, br, bc, /*pow2=*/true, out.q);
    return out;
  }
  if (scale > 0) {  // the scale an earlier cast of the same tensor took
    kernels::fp8_quantize_tensorwise(x, f, scale, out.q);
    out.scale = scale;
    return out;
  }
  const double amax = checked_amax(x, op);
  out.scale = cfg_.recipe == Fp8Recipe::Tensorwise ? kernels::fp8_scale_from_amax(amax, f, false)
                                                   : take_delayed_scale(op, amax);
  kernels::fp8_quantize_tensorwise(x, f, out.scale, out.q);
  return out;
}

float Fp8Gemm::take_delayed_scale(Fp8Operand op, double amax) {
  MOE_ASSERT(cfg_.recipe == Fp8Recipe::Delayed);
  const size_t i = static_cast<size_t>(op);
  const float scale = scales[i];
  std::vector<double>& h = histories[i];
  h.insert(h.begin(), amax);
  if (static_cast<int64_t>(h.size()) > cfg_.amax_history_len) h.resize(static_cast<size_t>(cfg_.amax_history_len));
  double a = h.front();
  if (cfg_.amax_max)
    for (double v : h) a = std::max(a, v);
  // TE keeps the previous scale while the amax is 0.
  if (a > 0)
    scales[i] = static_cast<float>(kernels::fp8_max(format(op)) / a / std::ldexp(1.0, static_cast<int>(cfg_.margin)));
  return scale;
}

Fp8ModelScope::Fp8ModelScope(const Fp8Config& cfg) {
  MOE_ASSERT_MSG(!g_scope, "nested Fp8ModelScope");
  g_cfg = cfg;
  g_scope = true;
}

Fp8ModelScope::~Fp8ModelScope() {
  g_scope = false;
}

std::shared_ptr<Fp8Gemm> fp8_gemm_for(const std::string& weight_name, TPContext tp) {
  if (!g_scope || !g_cfg.on()) return nullptr;
  const std::string pre = "decoder.layers.";
  if (weight_name.rfind(pre, 0) != 0) return nullptr;
  const int64_t layer = std::stoll(weight_name.substr(pre.size()));
  const Fp8Config& c = g_cfg;
  if (layer < c.bf16_start || layer >= c.num_layers - c.bf16_end) return nullptr;
  return std::make_shared<Fp8Gemm>(c, weight_name, tp);
}

}  // namespace moecore::nn
