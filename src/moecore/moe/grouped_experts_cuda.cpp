// The grouped experts on the GPU (see grouped_experts.h): the CPU path's computation and dtypes, with one grouped
// GEMM per projection and direction (kernels/grouped_gemm.h) instead of per-expert chunked GEMMs. Unlike the
// CPU path (which pads each expert's rows to a multiple of 32 for its fixed-shape oneDNN primitives), the GPU works
// on the dispatcher's rows as they come, expert-major and unpadded: cuBLAS takes any row count, and four copies of
// [R, H] per layer (into and out of a padded layout, forward and backward) are saved. Under --bf16 every GEMM writes
// the dtype the CPU's writes (h_dtype, rows_out_dtype: bf16 h and da without biases, bf16 y and dx without expert
// tensor parallelism), rounded by the GEMM's epilogue, and the activation, bias and combine kernels read bf16 as it
// is: no cast pass between them. Every row's result is the same computation; only the weight gradients' reduction
// over rows may round differently (tested against the CPU).
#include "moecore/core/timers.h"
#include "moecore/kernels/activation.h"
#include "moecore/kernels/grouped_gemm.h"
#include "moecore/moe/grouped_experts.h"

namespace moecore::moe {

namespace {
// Each expert's first row in the expert-major rows.
std::vector<int64_t> expert_begin(const std::vector<int64_t>& counts) {
  std::vector<int64_t> b;
  int64_t r = 0;
  for (int64_t c : counts) {
    b.push_back(r);
    r += c;
  }
  return b;
}

}  // namespace

Tensor GroupedExperts::forward_cuda(const Tensor& x_RH, const Tensor& probs_R, const std::vector<int64_t>& counts,
                                    Stash& st) {
  const Device d = x_RH.device();
  const int64_t R = x_RH.rows(), H = cfg_.hidden, F = cfg_.ffn_hidden, F1 = fc1_rows();
  MOE_ASSERT_MSG(fc1_->value.device() == d && fc2_->value.device() == d,
                 "expert rows on {} but the expert weights on {}: move the parameters with ParamRegistry::to", d.str(),
                 fc1_->value.device().str());
  MOE_ASSERT_MSG(fc1_->math_dtype() == DType::F32, "the GPU experts compute in f32, got {}",
                 dtype_name(fc1_->math_dtype()));
  MOE_ASSERT(probs_R.device() == d);
  const std::vector<int64_t> begin = expert_begin(counts);
  MOE_ASSERT_MSG(begin.empty() ? R == 0 : begin.back() + counts.back() == R, "{} expert rows, the counts give {}", R,
                 begin.empty() ? 0 : begin.back() + counts.back());
  st.tokens_per_expert = counts;
  st.row_begin = begin;
  const DType xt = cfg_.bf16 ? DType::BF16 : DType::F32;
  st.probs_R = probs_R.as_dtype(DType::F32).reshape({R});
  st.x_RH = x_RH.reshape({R, H}).as_dtype(xt);
  const Tensor* w1 = &fc1_->value;
  const Tensor* w2 = &fc2_->value;
  if (cfg_.bf16) {  // cached on the device for the step under a Bf16WeightScope (nn/parameter.h)
    w1_bf16_ = nn::bf16_weights(*fc1_);
    w2_bf16_ = nn::bf16_weights(*fc2_);
    w1 = &w1_bf16_;
    w2 = &w2_bf16_;
  }
  // h in h_dtype(): bf16 written by the GEMM under bf16 without biases. With a bias the GEMM writes f32, the bias
  // is added to the f32 product and h is rounded once after it (as the CPU path), so forward, backward and a
  // moe_act recompute read one bf16 h.
  st.h_RF1 = Tensor::empty({R, F1}, h_dtype(), d);
  kernels::grouped_gemm(st.x_RH, *w1, true, st.h_RF1, begin, counts);
  fc1_bias_forward(st, st.h_RF1);
  st.h_RF1 = st.h_RF1.as_dtype(xt);
  st.a_RF = Tensor::empty({R, F}, xt, d);
  if (R > 0) kernels::activation_forward(cfg_.activation, st.h_RF1, &st.probs_R, st.a_RF);
  // y in rows_out_dtype(): bf16 under bf16 (the combine sums a token's rows in f32); b2·p is added to the bf16 rows
  // in f32 and rounded again, as on the CPU.
  Tensor y = Tensor::empty({R, H}, rows_out_dtype(), d);
  kernels::grouped_gemm(st.a_RF, *w2, true, y, begin, counts);
  fc2_bias_forward(st, y);
  if (cfg_.recompute_act) st.a_RF = Tensor();
  return y;
}

Tensor GroupedExperts::backward_cuda(const Tensor& dy_RH, Stash& st, Tensor& dprobs_R, bool defer_wgrad) {
  const Device d = dy_RH.device();
  const int64_t R = dy_RH.rows(), H = cfg_.hidden, F = cfg_.ffn_hidden;
  const std::vector<int64_t>& counts = st.tokens_per_expert;
  const std::vector<int64_t> begin = expert_begin(counts);
  MOE_ASSERT(dy_RH.cols() == H && R == st.x_RH.rows());
  const DType xt = cfg_.bf16 ? DType::BF16 : DType::F32;
  const Tensor dy = dy_RH.reshape({R, H}).as_dtype(xt);
  const Tensor& w1 = cfg_.bf16 ? w1_bf16_ : fc1_->value;
  const Tensor& w2 = cfg_.bf16 ? w2_bf16_ : fc2_->value;
  if (!st.a_RF.defined()) {  // moe_act recompute: the activation again, exactly as forward wrote it
    st.a_RF = Tensor::empty({R, F}, xt, d);
    if (R > 0) kernels::activation_forward(cfg_.activation, st.h_RF1, &st.probs_R, st.a_RF);
  }
  // da in h_dtype() (bf16 under bf16 without biases, read by the activation's backward as it is), dx in
  // rows_out_dtype(): the dtypes the CPU's GEMMs write.
  Tensor da = Tensor::empty({R, F}, h_dtype(), d);
  kernels::grouped_gemm(dy, w2, false, da, begin, counts);
  if (!defer_wgrad) kernels::grouped_gemm_wgrad(dy, st.a_RF, fc2_->grad, begin, counts);
  Tensor dhc = Tensor::empty({R, st.h_RF1.cols()}, xt, d);
  dprobs_R = Tensor::empty({R}, DType::F32, d);
  if (R > 0) kernels::activation_backward(cfg_.activation, da, st.h_RF1, &st.probs_R, dhc, &dprobs_R);
  fc2_bias_backward(st, dy, dprobs_R);  // after the activation's backward, which writes dprobs
  fc1_bias_backward(st, dhc);
  Tensor dx = Tensor::empty({R, H}, rows_out_dtype(), d);
  kernels::grouped_gemm(dhc, w1, false, dx, begin, counts);
  if (defer_wgrad)
    st.wgrad = {dy, st.a_RF, dhc, st.x_RH, 0.0f, 0.0f, true};
  else
    kernels::grouped_gemm_wgrad(dhc, st.x_RH, fc1_->grad, begin, counts);
  st.x_RH = st.h_RF1 = st.a_RF = st.probs_R = Tensor();
  return dx;
}

// The deferred grouped weight-gradient GEMMs (backward_cuda with defer_wgrad), in backward's order.
void GroupedExperts::backward_wgrad_cuda(Stash& st) {
  Stash::DeferredWgrad& w = st.wgrad;
  const std::vector<int64_t> begin = expert_begin(st.tokens_per_expert);
  kernels::grouped_gemm_wgrad(w.dy, w.a, fc2_->grad, begin, st.tokens_per_expert);
  kernels::grouped_gemm_wgrad(w.dh, w.x, fc1_->grad, begin, st.tokens_per_expert);
  w = Stash::DeferredWgrad();
}

}  // namespace moecore::moe
