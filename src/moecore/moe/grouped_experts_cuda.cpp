// The grouped experts on the GPU (see grouped_experts.h): the CPU path's computation, layout and dtypes, with one
// grouped GEMM per projection and direction (kernels/cuda/grouped_gemm.h) instead of per-expert chunked GEMMs.
// The padded row layout is the CPU's (each expert's rows start at a multiple of kGpuRowAlign, zero rows in the gaps,
// GEMMs over the padded row counts), so the gap rows hold zeros exactly as there. Moving rows in and out of the
// padded layout is one row gather each way through two I32 row maps built on the host from the counts (already on
// the host: the dispatch copied them) and uploaded once per forward, asynchronously: the experts add no host sync.
#include "moecore/core/timers.h"
#include "moecore/kernels/cpu/activation.h"
#include "moecore/kernels/cuda/grouped_gemm.h"
#include "moecore/kernels/cuda/moe_kernels.h"
#include "moecore/moe/grouped_experts.h"

namespace moecore::moe {

namespace {
constexpr int64_t kGpuRowAlign = 32;  // grouped_experts.cpp's padded layout

int64_t gpu_align_rows(int64_t n) {
  return (n + kGpuRowAlign - 1) / kGpuRowAlign * kGpuRowAlign;
}

struct GpuPaddedLayout {
  std::vector<int64_t> begin, rows;  // per expert: first padded row, padded row count
  int64_t total = 0;
};

GpuPaddedLayout gpu_padded_layout(const std::vector<int64_t>& counts) {
  GpuPaddedLayout l;
  for (int64_t c : counts) {
    l.begin.push_back(l.total);
    l.rows.push_back(gpu_align_rows(c));
    l.total += gpu_align_rows(c);
  }
  return l;
}

bool gpu_rows_aligned(const std::vector<int64_t>& counts) {
  for (int64_t c : counts)
    if (c % kGpuRowAlign != 0) return false;
  return true;
}

// [rows, C] rows (or [rows]) gathered by an I32 row map into a new [map rows, C] tensor of `dtype` (negative map
// entries give zero rows); the tensor itself when no padding is needed and the dtype is already right.
Tensor gpu_remap(const Tensor& x, const Tensor& map, DType dtype, bool identity) {
  const int64_t rows = x.dim(0), C = rows == 0 ? 0 : x.numel() / rows;
  const Tensor x2 = x.reshape({rows, C});
  if (identity && x.dtype() == dtype) return x2;
  Tensor out = Tensor::empty({map.numel(), C}, dtype, x.device());
  kernels::cuda::moe_gather_rows(x2, map, out);
  return out;
}

Tensor gpu_bf16_weights(nn::Parameter& p) {
  // nn::bf16_weights keeps its cache on the host; on the GPU the conversion runs there, once per forward.
  return p.value.to(DType::BF16);
}
}  // namespace

Tensor GroupedExperts::forward_cuda(const Tensor& x_RH, const Tensor& probs_R, const std::vector<int64_t>& counts,
                                    Stash& st) {
  const Device d = x_RH.device();
  const int64_t R = x_RH.rows(), H = cfg_.hidden, F = cfg_.ffn_hidden, F1 = fc1_rows();
  MOE_ASSERT_MSG(fc1_->value.device() == d && fc2_->value.device() == d,
                 "expert rows on {} but the expert weights on {}: move the parameters with ParamRegistry::to", d.str(),
                 fc1_->value.device().str());
  MOE_ASSERT_MSG(fc1_->value.dtype() == DType::F32, "the GPU experts keep f32 weights, got {}",
                 dtype_name(fc1_->value.dtype()));
  MOE_ASSERT(probs_R.device() == d);
  const GpuPaddedLayout l = gpu_padded_layout(counts);
  const bool identity = gpu_rows_aligned(counts);
  // Row maps: padded row -> source row (−1 in the gaps), and row -> padded row; uploaded without a host sync.
  std::vector<int32_t> src_of_padded(static_cast<size_t>(l.total)), padded_of_row(static_cast<size_t>(R));
  int64_t src = 0;
  for (size_t e = 0; e < counts.size(); e++) {
    for (int64_t i = 0; i < l.rows[e]; i++)
      src_of_padded[static_cast<size_t>(l.begin[e] + i)] = i < counts[e] ? static_cast<int32_t>(src + i) : -1;
    for (int64_t i = 0; i < counts[e]; i++)
      padded_of_row[static_cast<size_t>(src + i)] = static_cast<int32_t>(l.begin[e] + i);
    src += counts[e];
  }
  st.row_of_padded_P = kernels::cuda::moe_upload_i32(src_of_padded, d);
  st.padded_of_row_R = kernels::cuda::moe_upload_i32(padded_of_row, d);
  st.tokens_per_expert = counts;
  const DType xt = cfg_.bf16 ? DType::BF16 : DType::F32;
  st.probs_R = gpu_remap(probs_R, st.row_of_padded_P, DType::F32, identity).reshape({l.total});
  st.x_RH = gpu_remap(x_RH, st.row_of_padded_P, xt, identity);
  const Tensor* w1 = &fc1_->value;
  const Tensor* w2 = &fc2_->value;
  if (cfg_.bf16) {
    w1_bf16_ = gpu_bf16_weights(*fc1_);
    w2_bf16_ = gpu_bf16_weights(*fc2_);
    w1 = &w1_bf16_;
    w2 = &w2_bf16_;
  }
  st.h_RF1 = Tensor::empty({l.total, F1}, DType::F32, d);
  kernels::cuda::grouped_gemm(st.x_RH, *w1, true, st.h_RF1, l.begin, l.rows);
  st.a_RF = Tensor::empty({l.total, F}, xt, d);
  if (l.total > 0) kernels::activation_forward(cfg_.activation, st.h_RF1, &st.probs_R, st.a_RF);
  Tensor y = Tensor::empty({l.total, H}, DType::F32, d);
  kernels::cuda::grouped_gemm(st.a_RF, *w2, true, y, l.begin, l.rows);
  if (cfg_.recompute_act) st.a_RF = Tensor();
  return gpu_remap(y, st.padded_of_row_R, DType::F32, identity);
}

Tensor GroupedExperts::backward_cuda(const Tensor& dy_RH, Stash& st, Tensor& dprobs_R) {
  const Device d = dy_RH.device();
  const int64_t R = dy_RH.rows(), H = cfg_.hidden, F = cfg_.ffn_hidden;
  const std::vector<int64_t>& counts = st.tokens_per_expert;
  const GpuPaddedLayout l = gpu_padded_layout(counts);
  const bool identity = gpu_rows_aligned(counts);
  MOE_ASSERT(dy_RH.cols() == H && l.total == st.x_RH.rows() && st.padded_of_row_R.numel() == R);
  const DType xt = cfg_.bf16 ? DType::BF16 : DType::F32;
  const Tensor dy = gpu_remap(dy_RH, st.row_of_padded_P, xt, identity);
  const Tensor& w1 = cfg_.bf16 ? w1_bf16_ : fc1_->value;
  const Tensor& w2 = cfg_.bf16 ? w2_bf16_ : fc2_->value;
  if (!st.a_RF.defined()) {  // moe_act recompute: the activation again, exactly as forward wrote it
    st.a_RF = Tensor::empty({l.total, F}, xt, d);
    if (l.total > 0) kernels::activation_forward(cfg_.activation, st.h_RF1, &st.probs_R, st.a_RF);
  }
  Tensor da = Tensor::empty({l.total, F}, DType::F32, d);
  kernels::cuda::grouped_gemm(dy, w2, false, da, l.begin, l.rows);
  kernels::cuda::grouped_gemm_wgrad(dy, st.a_RF, fc2_->grad, l.begin, l.rows);
  Tensor dhc = Tensor::empty({l.total, st.h_RF1.cols()}, xt, d);
  Tensor dprobs = Tensor::empty({l.total}, DType::F32, d);
  if (l.total > 0) kernels::activation_backward(cfg_.activation, da, st.h_RF1, &st.probs_R, dhc, &dprobs);
  Tensor dx = Tensor::empty({l.total, H}, DType::F32, d);
  kernels::cuda::grouped_gemm(dhc, w1, false, dx, l.begin, l.rows);
  kernels::cuda::grouped_gemm_wgrad(dhc, st.x_RH, fc1_->grad, l.begin, l.rows);
  dprobs_R = gpu_remap(dprobs, st.padded_of_row_R, DType::F32, identity).reshape({R});
  Tensor out = gpu_remap(dx, st.padded_of_row_R, DType::F32, identity);
  st.x_RH = st.h_RF1 = st.a_RF = st.probs_R = st.padded_of_row_R = st.row_of_padded_P = Tensor();
  return out;
}

}  // namespace moecore::moe
