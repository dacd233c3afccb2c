// Grouped experts (see grouped_experts.h). Per expert e with rows X_e (1: a column of ones, p: the rows'
// probabilities):
//   H_e = X_e·W1_eᵀ + 1·b1_e;  A_e = act(H_e) ⊙ p;  Y_e = A_e·W2_eᵀ + p·b2_e
// Backward (accumulating into the parameter gradients):
//   dA_e = dY_e·W2_e, dW2_e += dY_eᵀ·A_e, db2_e += pᵀ·dY_e (∂Y[r, j]/∂b2[e, j] = p_r);
//   (dH_e, dp) = act'(...), dp_r += dY_e[r]·b2_e (∂Y[r, j]/∂p_r = b2[e, j] through the bias);
//   dX_e = dH_e·W1_e, dW1_e += dH_eᵀ·X_e, db1_e += 1ᵀ·dH_e
#include "moecore/moe/grouped_experts.h"

#include <algorithm>
#include <cmath>

#include "moecore/core/timers.h"
#include "moecore/kernels/elementwise.h"
#include "moecore/kernels/gemm.h"
#include "moecore/kernels/grouped_gemm.h"
#include "moecore/nn/fp8_param.h"
#include "moecore/nn/stash_bytes.h"

namespace moecore::moe {

GroupedExperts::GroupedExperts(nn::ParamRegistry& reg, const std::string& name, const ExpertsConfig& cfg) : cfg_(cfg) {
  MOE_ASSERT(cfg.hidden > 0 && cfg.ffn_hidden > 0 && cfg.num_experts > 0);
  fc1_ = &reg.add(name + ".linear_fc1.weight", {cfg.num_experts, fc1_rows(), cfg.hidden},
                  nn::InitRule::normal(cfg.init_std));
  fc2_ = &reg.add(name + ".linear_fc2.weight", {cfg.num_experts, cfg.hidden, cfg.ffn_hidden},
                  nn::InitRule::normal(cfg.output_init_std));
  // Weights are drawn by global expert index (and, under expert tensor parallelism, global FFN column), so a
  // shard holds exactly its part of the single-rank values: fc1 seen as [E, (2,) F, H], fc2 as [E, H, F].
  MOE_ASSERT(cfg.etp_rank >= 0 && cfg.etp_rank < cfg.etp_size);
  const int64_t E = cfg.num_global_experts > 0 ? cfg.num_global_experts : cfg.num_experts, F = cfg.ffn_hidden;
  const int64_t n = cfg.num_experts, f0 = cfg.etp_rank * F, FG = F * cfg.etp_size, H = cfg.hidden;
  if (kernels::is_gated(cfg.activation))
    fc1_->set_shard({E, 2, FG, H}, {cfg.first_expert, 0, f0, 0}, {n, 2, F, H});
  else
    fc1_->set_shard({E, FG, H}, {cfg.first_expert, f0, 0}, {n, F, H});
  fc2_->set_shard({E, H, FG}, {cfg.first_expert, 0, f0}, {n, H, F});
  fc1_->expert_parallel = fc2_->expert_parallel = true;
  fc1_->low_storage = fc2_->low_storage = cfg.low;  // read only by the low-precision grouped GEMMs (low_weights)
  fc1_->tensor_parallel = fc2_->tensor_parallel = cfg.etp_size > 1;
  if (cfg.bias) {
    // Megatron (TransformerConfig) allows expert biases with ETP 1 only: a row-parallel fc2's bias would be added
    // once per ETP rank before the reduce-scatter. The flags are refused before this (train/config_resolve.cpp).
    MOE_ASSERT_MSG(cfg.etp_size == 1, "expert biases with expert tensor parallelism {}", cfg.etp_size);
    // Zero, as Transformer Engine initialises them; no weight decay, as for every bias.
    b1_ = &reg.add(name + ".linear_fc1.bias", {n, fc1_rows()}, nn::InitRule::zeros(), /*no_weight_decay=*/true);
    b2_ = &reg.add(name + ".linear_fc2.bias", {n, H}, nn::InitRule::zeros(), /*no_weight_decay=*/true);
    if (kernels::is_gated(cfg.activation))
      b1_->set_shard({E, 2, FG}, {cfg.first_expert, 0, f0}, {n, 2, F});
    else
      b1_->set_shard({E, FG}, {cfg.first_expert, f0}, {n, F});
    b2_->set_shard({E, H}, {cfg.first_expert, 0}, {n, H});
    b1_->expert_parallel = b2_->expert_parallel = true;
  }
  fp8_.build(fc1_->name, fc2_->name, cfg.num_experts, cfg.first_expert, {cfg.etp_group});
  // --fp8-param-gather: the weights held as FP8, one set of scales per expert (each expert its own site).
  nn::make_fp8_param(*fc1_, fp8_.sites(ExpertFp8::kFc1), fc1_rows(), H);
  nn::make_fp8_param(*fc2_, fp8_.sites(ExpertFp8::kFc2), H, F);
  prepare_gemms();
}

namespace {
// Inside the experts every expert's rows start at a multiple of the grouped GEMMs' row alignment on the device
// (kernels::grouped_gemm_row_align: the CPU's fixed-shape products want 32, the GPU takes any count) and the gap
// after them holds zero rows: zero rows add nothing to any weight gradient, and their outputs are never read. On
// the CPU without expert tensor parallelism the dispatcher writes the rows in this layout already
// (DispatchPlan::row_align), and the experts hand their outputs back in it.
int64_t align_rows(int64_t n, int64_t align) {
  return (n + align - 1) / align * align;
}

int64_t padded_total(const std::vector<int64_t>& counts, int64_t align) {
  int64_t n = 0;
  for (int64_t c : counts) n += align_rows(c, align);
  return n;
}

// Each expert's first row and block of rows (its rows and the gap after them) in the padded layout.
void padded_layout(const std::vector<int64_t>& counts, int64_t align, std::vector<int64_t>& begin,
                   std::vector<int64_t>& block) {
  begin.resize(counts.size());
  block.resize(counts.size());
  int64_t r0 = 0;
  for (size_t e = 0; e < counts.size(); e++) {
    begin[e] = r0;
    block[e] = align_rows(counts[e], align);
    r0 += block[e];
  }
}

// Runs fn(e, row_begin, padded_rows) for every expert with rows, in the padded layout.
template <typename Fn>
void for_each_expert(const std::vector<int64_t>& counts, int64_t align, Fn fn) {
  int64_t r0 = 0;
  for (size_t e = 0; e < counts.size(); e++) {
    const int64_t n = align_rows(counts[e], align);
    if (n > 0) fn(static_cast<int64_t>(e), r0, n);
    r0 += n;
  }
}

// A padded [rows, C] buffer on `d` allocated at the largest padded size R rows can take over these experts, so its
// size (and the allocator's cached block) is the same every step however the rows are distributed.
Tensor padded_empty(const std::vector<int64_t>& counts, int64_t align, int64_t C, DType dtype, Device d) {
  int64_t R = 0;
  for (int64_t c : counts) R += c;
  const int64_t capacity = R + static_cast<int64_t>(counts.size()) * (align - 1);
  return Tensor::empty({capacity, C}, dtype, d).slice(0, padded_total(counts, align));
}

bool already_aligned(const std::vector<int64_t>& counts, int64_t align) {
  return std::all_of(counts.begin(), counts.end(), [&](int64_t c) { return c % align == 0; });
}

// [R, C] rows grouped by expert -> [padded_total, C] of `dtype` with zero gap rows (x itself when it is already in
// the layout, as the dispatcher writes it, and of the dtype).
Tensor to_padded(const Tensor& x, const std::vector<int64_t>& counts, int64_t align, DType dtype) {
  const int64_t C = x.numel() / std::max<int64_t>(x.dim(0), 1);
  if (x.dim(0) == padded_total(counts, align))
    return x.dtype() == dtype ? x.reshape({x.dim(0), C}) : x.reshape({x.dim(0), C}).to(dtype);
  Tensor out = padded_empty(counts, align, C, dtype, x.device());
  int64_t src = 0, dst = 0;
  for (int64_t c : counts) {
    const int64_t n = align_rows(c, align);
    if (c > 0) out.slice(dst, c).copy_from(x.reshape({x.dim(0), C}).slice(src, c));
    if (n > c) out.slice(dst + c, n - c).zero_();
    src += c;
    dst += n;
  }
  return out;
}

// The inverse: the expert rows of a padded [padded_total, C] tensor in `shape` ([R, C], or [R] for C = 1); xp
// itself where the caller takes the padded layout (padded_io).
Tensor from_padded(const Tensor& xp, const std::vector<int64_t>& counts, int64_t align, const Shape& shape,
                   bool padded_io) {
  if (padded_io) return shape.ndim() == 1 ? xp.reshape({xp.dim(0)}) : xp.reshape({xp.dim(0), shape[1]});
  if (already_aligned(counts, align)) return xp.reshape(shape);
  Tensor out = Tensor::empty(shape, xp.dtype(), xp.device());
  const int64_t C = xp.numel() / std::max<int64_t>(xp.dim(0), 1);
  Tensor out2 = out.reshape({shape[0], C});
  int64_t src = 0, dst = 0;
  for (int64_t c : counts) {
    if (c > 0) out2.slice(dst, c).copy_from(xp.reshape({xp.dim(0), C}).slice(src, c));
    src += align_rows(c, align);
    dst += c;
  }
  return out;
}

Tensor expert_weight(const Tensor& w, int64_t e) {
  return w.slice(e, 1).reshape({w.dim(1), w.dim(2)});
}

// Under bf16 inside a Bf16WeightScope the grouped GEMMs' CPU backend multiplies op(W_e) packed once per step
// (kernels::PackedWeight): slot e of `param`.
kernels::ExpertWeightPacker bf16_packer(nn::Parameter& param, const Tensor& W, bool trans_w) {
  return [&param, &W, trans_w](int64_t e, int64_t rows) {
    return nn::packed_bf16_weight(param, expert_weight(W, e), e, trans_w, rows);
  };
}

// Each expert's slice of a stale gradient (Parameter::grad_stale) is overwritten by its first weight-gradient GEMM;
// the slices of experts without rows are zeroed.
float take_expert_grad_beta(nn::Parameter& p, const std::vector<int64_t>& counts) {
  const float beta = p.take_grad_beta();
  if (beta == 0.0f)
    for (size_t e = 0; e < counts.size(); e++)
      if (counts[e] == 0) expert_weight(p.grad, static_cast<int64_t>(e)).zero_();
  return beta;
}
}  // namespace

int64_t GroupedExperts::row_align(Device d) {
  return kernels::grouped_gemm_row_align(d);
}

// With bf16 the rows the experts hand back (fc2's output forward, fc1's data gradient backward) are bf16 as
// Megatron's are, written so by the GEMM: the combine and the dispatch's backward read half the bytes and sum in f32.
// Under expert tensor parallelism they stay f32: they are partial sums, reduced over the ETP group first.
DType GroupedExperts::rows_out_dtype() const {
  const DType wt = fc1_->math_dtype();
  return cfg_.low && cfg_.etp_size == 1 && wt != DType::F64 ? *cfg_.low : wt;
}

// With bf16 fc1's GEMM rounds h as it writes it, as Megatron keeps it. With a bias the GEMM writes f32 and the bias
// is added to the f32 product before h is rounded (nn/mlp.cpp does so for a dense fc1 with a bias too); the fc2
// data-gradient GEMM then writes da in f32, which the bias's gradient path keeps.
DType GroupedExperts::h_dtype() const {
  return cfg_.low && !cfg_.bias ? *cfg_.low : fc1_->math_dtype();
}

void GroupedExperts::fc1_bias_forward(const Stash& st, Tensor& h_RF1) const {
  if (b1_) kernels::segment_bias_forward(b1_->value, nullptr, {st.row_begin, st.tokens_per_expert}, h_RF1);
}

void GroupedExperts::fc2_bias_forward(const Stash& st, Tensor& y_RH) const {
  if (b2_) kernels::segment_bias_forward(b2_->value, &st.probs_R, {st.row_begin, st.tokens_per_expert}, y_RH);
}

void GroupedExperts::fc1_bias_backward(const Stash& st, const Tensor& dh_RF1) {
  if (b1_) kernels::segment_bias_backward(dh_RF1, nullptr, {st.row_begin, st.tokens_per_expert}, b1_->grad_to_add());
}

void GroupedExperts::fc2_bias_backward(const Stash& st, const Tensor& dy_RH, Tensor& dprobs_R) {
  if (b2_)
    kernels::segment_bias_backward(dy_RH, &st.probs_R, {st.row_begin, st.tokens_per_expert}, b2_->grad_to_add(),
                                   &b2_->value, &dprobs_R);
}

void GroupedExperts::prepare_gemms() const {
  const DType wt = fc1_->math_dtype();
  if (wt == DType::F64) return;  // the f64 reference loop has no primitives
  const DType dt = cfg_.low ? *cfg_.low : wt, rows_out = rows_out_dtype();
  const int64_t H = cfg_.hidden, F = cfg_.ffn_hidden, F1 = fc1_rows();
  kernels::grouped_gemm_prepare(F1, H, true, dt, h_dtype(), cfg_.low == DType::BF16);  // fc1
  kernels::grouped_gemm_prepare(H, F, true, dt, rows_out, cfg_.low == DType::BF16);    // fc2
  kernels::grouped_gemm_prepare(F, H, false, dt, h_dtype(), cfg_.low == DType::BF16);  // fc2 data gradient (da)
  kernels::grouped_gemm_prepare(H, F1, false, dt, rows_out, cfg_.low == DType::BF16);  // fc1 data gradient
  kernels::grouped_gemm_wgrad_prepare(H, F, dt);                                       // fc2 weight gradient
  kernels::grouped_gemm_wgrad_prepare(F1, H, dt);                                      // fc1 weight gradient
}

Tensor GroupedExperts::forward(const Tensor& x_RH, const Tensor& probs_R, const std::vector<int64_t>& counts,
                               Stash& st) {
  TimerScope timer("moe-expert-compute", 2);  // moecore's MoE timer (core/timers.h), forward and backward
  const int64_t R = x_RH.rows(), H = cfg_.hidden, F = cfg_.ffn_hidden, F1 = fc1_rows();
  MOE_ASSERT(x_RH.cols() == H && probs_R.numel() == R && static_cast<int64_t>(counts.size()) == cfg_.num_experts);
  const Device d = x_RH.device();
  MOE_ASSERT_MSG(fc1_->value.device() == d && fc2_->value.device() == d && probs_R.device() == d,
                 "expert rows on {} but the expert weights on {}: move the parameters with ParamRegistry::to", d.str(),
                 fc1_->value.device().str());
  const int64_t align = row_align(d);
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  st.padded_io = R != total;
  MOE_ASSERT_MSG(total == R || R == padded_total(counts, align),
                 "expert row counts sum to {} ({} padded), but {} rows were dispatched", total,
                 padded_total(counts, align), R);
  const DType dt = fc1_->math_dtype();
  st.tokens_per_expert = counts;
  st.row_align = align;
  padded_layout(counts, align, st.row_begin, st.block_rows);
  st.probs_R = to_padded(probs_R, counts, align, dt);
  const Tensor* w1 = &fc1_->value;
  const Tensor* w2 = &fc2_->value;
  if (cfg_.low &&
      !fc1_->fp8) {  // cached for the step under a Bf16WeightScope (nn/parameter.h); FP8 weights as they are
    w1_low_ = nn::low_weights(*fc1_, *cfg_.low);
    w2_low_ = nn::low_weights(*fc2_, *cfg_.low);
    w1 = &w1_low_;
    w2 = &w2_low_;
  }
  const kernels::ExpertWeightPacker pack1 = bf16_packer(*fc1_, *w1, true), pack2 = bf16_packer(*fc2_, *w2, true);
  st.x_RH = to_padded(x_RH, counts, align, cfg_.low ? *cfg_.low : dt);
  // With bf16 and no bias the fc1 GEMM rounds its output as it writes it (h_dtype): the activation and its
  // backward read half the bytes, and the stash holds half.
  st.h_RF1 = padded_empty(counts, align, F1, h_dtype(), d);
  if (fp8_.on()) {
    for_each_expert(counts, align, [&](int64_t e, int64_t r0, int64_t n) {
      Tensor h = st.h_RF1.slice(r0, n);
      fp8_.forward(ExpertFp8::kFc1, e, st.x_RH.slice(r0, n), expert_weight(*w1, e), h, st.fp8_x_scales);
    });
  } else {
    kernels::grouped_gemm(st.x_RH, *w1, true, st.h_RF1, st.row_begin, st.block_rows,
                          cfg_.low == DType::BF16 ? &pack1 : nullptr);
  }
  fc1_bias_forward(st, st.h_RF1);
  if (cfg_.low && st.h_RF1.dtype() != *cfg_.low) {
    // h with a bias (added to the f32 product) rounded once before the activation reads it, as Megatron's bf16 fc1
    // writes it: the activation, its backward and a moe_act recompute read the one bf16 h the stash keeps.
    Tensor h16 = padded_empty(counts, align, F1, *cfg_.low, d);
    h16.copy_from(st.h_RF1);
    st.h_RF1 = h16;
  }
  // With bf16 the activation output is rounded as it is written: it only feeds the fc2 GEMMs.
  st.a_RF = padded_empty(counts, align, F, cfg_.low ? *cfg_.low : dt, d);
  if (st.a_RF.rows() > 0) kernels::activation_forward(cfg_.activation, st.h_RF1, &st.probs_R, st.a_RF);
  Tensor y = padded_empty(counts, align, H, rows_out_dtype(), d);
  if (fp8_.on()) {
    for_each_expert(counts, align, [&](int64_t e, int64_t r0, int64_t n) {
      Tensor yr = y.slice(r0, n);
      fp8_.forward(ExpertFp8::kFc2, e, st.a_RF.slice(r0, n), expert_weight(*w2, e), yr, st.fp8_x_scales);
    });
  } else {
    kernels::grouped_gemm(st.a_RF, *w2, true, y, st.row_begin, st.block_rows,
                          cfg_.low == DType::BF16 ? &pack2 : nullptr);
  }
  // Under bf16 fc2's rows are bf16 and b2·p is added to them in f32 and rounded again, as Megatron's _apply_bias
  // adds it to the bf16 GEMM output.
  fc2_bias_forward(st, y);
  if (cfg_.recompute_act) st.a_RF = Tensor();
  return from_padded(y, counts, align, {R, H}, st.padded_io);
}

Tensor GroupedExperts::backward(const Tensor& dy_RH, Stash& st, Tensor& dprobs_R, bool defer_wgrad) {
  TimerScope timer("moe-expert-compute", 2);
  const int64_t R = dy_RH.rows(), H = cfg_.hidden, F = cfg_.ffn_hidden;
  const std::vector<int64_t>& counts = st.tokens_per_expert;
  const int64_t align = st.row_align, Rp = padded_total(counts, align);
  const Device d = dy_RH.device();
  MOE_ASSERT(dy_RH.cols() == H && Rp == st.x_RH.rows() && (!st.padded_io || R == Rp));
  const DType dt = fc1_->math_dtype();
  MOE_CHECK(!defer_wgrad || !fp8_.on(),
            "--delay-wgrad-compute: the FP8 experts compute data and weight gradients together; drop one of the two");
  MOE_ASSERT_MSG(!st.wgrad.pending, "a deferred weight gradient was never computed");
  const Tensor dy = to_padded(dy_RH, counts, align, cfg_.low ? *cfg_.low : dt);
  const Tensor& w1 = cfg_.low ? w1_low_ : fc1_->value;
  const Tensor& w2 = cfg_.low ? w2_low_ : fc2_->value;
  const kernels::ExpertWeightPacker pack1 = bf16_packer(*fc1_, w1, false), pack2 = bf16_packer(*fc2_, w2, false);
  if (!st.a_RF.defined()) {  // moe_act recompute: the activation again, exactly as forward wrote it
    st.a_RF = padded_empty(counts, align, F, cfg_.low ? *cfg_.low : dt, d);
    if (Rp > 0) kernels::activation_forward(cfg_.activation, st.h_RF1, &st.probs_R, st.a_RF);
  }
  // With bf16 the fc2 data-gradient GEMM rounds da as it writes it, as Megatron's bf16 autograd keeps it; the
  // activation's backward reads it widened (f32 with a bias: h_dtype).
  Tensor da = padded_empty(counts, align, F, h_dtype(), d);
  const float beta2 = take_expert_grad_beta(*fc2_, counts), beta1 = take_expert_grad_beta(*fc1_, counts);
  // One expert GEMM's backward: din = dout·W (rows per expert) and, unless deferred, dW += doutᵀ·in; FP8 sites
  // compute both per expert.
  auto gemm_backward = [&](int site, const Tensor& dout, const Tensor& in, const Tensor& w,
                           const kernels::ExpertWeightPacker& pack, nn::Parameter& fc, float beta, Tensor& din) {
    if (fp8_.on()) {
      for_each_expert(counts, align, [&](int64_t e, int64_t r0, int64_t n) {
        Tensor dr = din.slice(r0, n), dw = expert_weight(fc.grad, e);
        fp8_.backward(site, e, dout.slice(r0, n), in.slice(r0, n), st.fp8_x_scales, dr, dw, beta);
      });
    } else {
      kernels::grouped_gemm(dout, w, false, din, st.row_begin, st.block_rows,
                            cfg_.low == DType::BF16 ? &pack : nullptr);
      if (!defer_wgrad) kernels::grouped_gemm_wgrad(dout, in, fc.grad, st.row_begin, st.block_rows, beta);
    }
  };
  gemm_backward(ExpertFp8::kFc2, dy, st.a_RF, w2, pack2, *fc2_, beta2, da);
  Tensor dhc = padded_empty(counts, align, st.h_RF1.cols(), cfg_.low ? *cfg_.low : dt, d);
  Tensor dprobs = padded_empty(counts, align, 1, dt, d).reshape({Rp});
  if (Rp > 0) kernels::activation_backward(cfg_.activation, da, st.h_RF1, &st.probs_R, dhc, &dprobs);
  fc2_bias_backward(st, dy, dprobs);  // after the activation's backward, which writes dprobs
  fc1_bias_backward(st, dhc);
  Tensor dx = padded_empty(counts, align, H, rows_out_dtype(), d);
  gemm_backward(ExpertFp8::kFc1, dhc, st.x_RH, w1, pack1, *fc1_, beta1, dx);
  if (defer_wgrad) st.wgrad = {dy, st.a_RF, dhc, st.x_RH, beta2, beta1, true};
  dprobs_R = from_padded(dprobs, counts, align, {R}, st.padded_io);
  st.x_RH = st.h_RF1 = st.a_RF = st.probs_R = Tensor();
  return from_padded(dx, counts, align, {R, H}, st.padded_io);
}

void GroupedExperts::backward_wgrad(Stash& st, const std::function<void()>& between) {
  if (!st.wgrad.pending) return;
  TimerScope timer("moe-expert-compute", 2);
  Stash::DeferredWgrad& w = st.wgrad;
  // The fc2 then fc1 weight gradients backward would have run (every expert's slice of the gradient is its own, so
  // the order across experts and projections changes no bit).
  kernels::grouped_gemm_wgrad(w.dy, w.a, fc2_->grad, st.row_begin, st.block_rows, w.beta2);
  if (between) between();
  kernels::grouped_gemm_wgrad(w.dh, w.x, fc1_->grad, st.row_begin, st.block_rows, w.beta1);
  w = Stash::DeferredWgrad();
}

Tensor sequential_experts_forward(const Tensor& w1, const Tensor& w2, kernels::Activation act, const Tensor& x_RH,
                                  const Tensor& probs_R, const std::vector<int64_t>& counts, const Tensor* b1,
                                  const Tensor* b2) {
  const int64_t H = x_RH.cols(), F1 = w1.dim(1), F = w2.dim(2), R = x_RH.rows();
  Tensor y = Tensor::zeros({R, H}, DType::F64);
  std::vector<double> h(static_cast<size_t>(F1)), a(static_cast<size_t>(F));
  int64_t r = 0;
  for (size_t e = 0; e < counts.size(); e++)
    for (int64_t i = 0; i < counts[e]; i++, r++) {
      for (int64_t f = 0; f < F1; f++) {
        double s = 0;
        for (int64_t k = 0; k < H; k++) s += x_RH.item(r * H + k) * w1.item((e * F1 + f) * H + k);
        h[f] = s + (b1 ? b1->item(static_cast<int64_t>(e) * F1 + f) : 0.0);
      }
      for (int64_t f = 0; f < F; f++) {
        double v;
        if (act == kernels::Activation::SwiGLU) {
          v = h[f] / (1 + std::exp(-h[f])) * h[f + F];
        } else if (act == kernels::Activation::GeLU) {
          v = 0.5 * h[f] * (1 + std::erf(h[f] / std::sqrt(2.0)));
        } else {
          v = h[f] > 0 ? h[f] * h[f] : 0;
        }
        a[f] = v * probs_R.item(r);
      }
      for (int64_t k = 0; k < H; k++) {
        double s = 0;
        for (int64_t f = 0; f < F; f++) s += a[f] * w2.item((e * H + k) * F + f);
        y.set_item(r * H + k, s + (b2 ? b2->item(static_cast<int64_t>(e) * H + k) * probs_R.item(r) : 0.0));
      }
    }
  return y;
}

// What GroupedExperts::forward leaves in its Stash for `rows` rows spread evenly over the local experts
// (nn/stash_bytes.h), on the CPU: padded buffers are allocated at rows + experts·(align − 1), their largest size. The
// input rows are the dispatcher's, in the padded layout (RowLayout::align) except under expert tensor parallelism,
// where rows the experts need not pad are taken as they come.
int64_t grouped_experts_stash_bytes(const ExpertsConfig& e, int64_t rows) {
  const int64_t n = std::max<int64_t>(e.num_experts, 1), F1 = (kernels::is_gated(e.activation) ? 2 : 1) * e.ffn_hidden;
  bool aligned = e.etp_size > 1;
  const int64_t align = kernels::grouped_gemm_row_align(Device::cpu());
  for (int64_t i = 0; i < n; i++) aligned &= (rows / n + (i < rows % n ? 1 : 0)) % align == 0;
  const int64_t cap = rows + n * (align - 1);
  const DType xt = e.low.value_or(DType::F32);
  int64_t b = nn::tensor_bytes((aligned ? rows : cap) * e.hidden, xt) + nn::tensor_bytes(cap, DType::F32);  // x, p
  b += nn::tensor_bytes(cap * F1, xt);                                                                      // h_RF1
  if (!e.recompute_act) b += nn::tensor_bytes(cap * e.ffn_hidden, xt);                                      // a_RF
  return b;
}

}  // namespace moecore::moe
