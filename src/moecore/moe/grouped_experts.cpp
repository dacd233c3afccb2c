// Grouped experts (see grouped_experts.h). Per expert e with rows X_e:
//   H_e = X_e·W1_eᵀ;  A_e = act(H_e) ⊙ p;  Y_e = A_e·W2_eᵀ
// Backward: dA_e = dY_e·W2_e, dW2_e += dY_eᵀ·A_e;  (dH_e, dp) = act'(...);  dX_e = dH_e·W1_e, dW1_e += dH_eᵀ·X_e
#include "moecore/moe/grouped_experts.h"

#include <cmath>

#include "moecore/kernels/cpu/gemm.h"

namespace moecore::moe {

GroupedExperts::GroupedExperts(nn::ParamRegistry& reg, const std::string& name, const ExpertsConfig& cfg)
    : cfg_(cfg) {
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
  fc1_->tensor_parallel = fc2_->tensor_parallel = cfg.etp_size > 1;
}

namespace {
// Runs fn(e, row_begin, rows) for every expert with rows.
template <typename Fn>
void for_each_expert(const std::vector<int64_t>& counts, Fn fn) {
  int64_t r0 = 0;
  for (size_t e = 0; e < counts.size(); e++) {
    if (counts[e] > 0) fn(static_cast<int64_t>(e), r0, counts[e]);
    r0 += counts[e];
  }
}

Tensor expert_weight(const Tensor& w, int64_t e) { return w.slice(e, 1).reshape({w.dim(1), w.dim(2)}); }

// An expert's rows go through fixed-shape GEMMs in chunks of kRowChunk rows (oneDNN's fastest kernels, one
// primitive per weight shape) and one run-time-M GEMM for the remainder: the set of primitives stays bounded
// however the row counts change from step to step.
constexpr int64_t kRowChunk = 256;

// C_rows = A_rows · op(W)   (forward and data-gradient GEMMs)
void rows_gemm(const Tensor& A, const Tensor& W, bool trans_w, Tensor& C) {
  const int64_t n = A.rows(), full = n / kRowChunk * kRowChunk;
  for (int64_t r = 0; r < full; r += kRowChunk) {
    Tensor c = C.slice(r, kRowChunk);
    kernels::gemm(A.slice(r, kRowChunk), false, W, trans_w, c);
  }
  if (full < n) {
    Tensor c = C.slice(full, n - full);
    kernels::gemm_dynamic(A.slice(full, n - full), false, W, trans_w, c);
  }
}

// dW += dY_rowsᵀ · X_rows   (weight-gradient GEMM, reduced over rows chunk by chunk in a fixed order)
void wgrad_gemm(const Tensor& dY, const Tensor& X, Tensor& dW) {
  const int64_t n = dY.rows(), full = n / kRowChunk * kRowChunk;
  for (int64_t r = 0; r < full; r += kRowChunk)
    kernels::gemm(dY.slice(r, kRowChunk), true, X.slice(r, kRowChunk), false, dW, 1.0f, 1.0f);
  if (full < n) kernels::gemm_dynamic(dY.slice(full, n - full), true, X.slice(full, n - full), false, dW, 1.0f, 1.0f);
}
}  // namespace

Tensor GroupedExperts::forward(const Tensor& x_RH, const Tensor& probs_R, const std::vector<int64_t>& counts,
                               Stash& st) {
  const int64_t R = x_RH.rows(), H = cfg_.hidden, F = cfg_.ffn_hidden, F1 = fc1_rows();
  MOE_ASSERT(x_RH.cols() == H && probs_R.numel() == R && static_cast<int64_t>(counts.size()) == cfg_.num_experts);
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  MOE_ASSERT_MSG(total == R, "expert row counts sum to {}, but {} rows were dispatched", total, R);
  const DType dt = fc1_->value.dtype();
  st.tokens_per_expert = counts;
  st.probs_R = probs_R;
  const Tensor* w1 = &fc1_->value;
  const Tensor* w2 = &fc2_->value;
  if (cfg_.bf16) {
    w1_bf16_ = fc1_->value.to(DType::BF16);
    w2_bf16_ = fc2_->value.to(DType::BF16);
    w1 = &w1_bf16_;
    w2 = &w2_bf16_;
    st.x_RH = x_RH.dtype() == DType::BF16 ? x_RH : x_RH.to(DType::BF16);
  } else {
    st.x_RH = x_RH;
  }
  st.h_RF1 = Tensor::empty({R, F1}, dt);
  for_each_expert(counts, [&](int64_t e, int64_t r0, int64_t n) {
    Tensor h = st.h_RF1.slice(r0, n);
    rows_gemm(st.x_RH.slice(r0, n), expert_weight(*w1, e), true, h);
  });
  // With bf16 the activation output is rounded as it is written: it only feeds the fc2 GEMMs.
  st.a_RF = Tensor::empty({R, F}, cfg_.bf16 ? DType::BF16 : dt);
  kernels::activation_forward(cfg_.activation, st.h_RF1, &probs_R, st.a_RF);
  Tensor y = Tensor::empty({R, H}, dt);
  for_each_expert(counts, [&](int64_t e, int64_t r0, int64_t n) {
    Tensor yr = y.slice(r0, n);
    rows_gemm(st.a_RF.slice(r0, n), expert_weight(*w2, e), true, yr);
  });
  return y;
}

Tensor GroupedExperts::backward(const Tensor& dy_RH, Stash& st, Tensor& dprobs_R) {
  const int64_t R = dy_RH.rows(), H = cfg_.hidden, F = cfg_.ffn_hidden;
  MOE_ASSERT(dy_RH.cols() == H && R == st.x_RH.rows());
  const DType dt = fc1_->value.dtype();
  const std::vector<int64_t>& counts = st.tokens_per_expert;
  const Tensor dy = cfg_.bf16 && dy_RH.dtype() != DType::BF16 ? dy_RH.to(DType::BF16) : dy_RH;
  const Tensor& w1 = cfg_.bf16 ? w1_bf16_ : fc1_->value;
  const Tensor& w2 = cfg_.bf16 ? w2_bf16_ : fc2_->value;
  Tensor da = Tensor::empty({R, F}, dt);
  for_each_expert(counts, [&](int64_t e, int64_t r0, int64_t n) {
    Tensor dar = da.slice(r0, n);
    rows_gemm(dy.slice(r0, n), expert_weight(w2, e), false, dar);
    Tensor dw2 = expert_weight(fc2_->grad, e);
    wgrad_gemm(dy.slice(r0, n), st.a_RF.slice(r0, n), dw2);
  });
  Tensor dhc = Tensor::empty(st.h_RF1.shape(), cfg_.bf16 ? DType::BF16 : dt);
  dprobs_R = Tensor::empty({R}, dt);
  kernels::activation_backward(cfg_.activation, da, st.h_RF1, &st.probs_R, dhc, &dprobs_R);
  Tensor dx = Tensor::empty({R, H}, dt);
  for_each_expert(counts, [&](int64_t e, int64_t r0, int64_t n) {
    Tensor dxr = dx.slice(r0, n);
    rows_gemm(dhc.slice(r0, n), expert_weight(w1, e), false, dxr);
    Tensor dw1 = expert_weight(fc1_->grad, e);
    wgrad_gemm(dhc.slice(r0, n), st.x_RH.slice(r0, n), dw1);
  });
  st.x_RH = st.h_RF1 = st.a_RF = st.probs_R = Tensor();
  return dx;
}

Tensor sequential_experts_forward(const Tensor& w1, const Tensor& w2, kernels::Activation act, const Tensor& x_RH,
                                  const Tensor& probs_R, const std::vector<int64_t>& counts) {
  const int64_t H = x_RH.cols(), F1 = w1.dim(1), F = w2.dim(2), R = x_RH.rows();
  Tensor y = Tensor::zeros({R, H}, DType::F64);
  std::vector<double> h(static_cast<size_t>(F1)), a(static_cast<size_t>(F));
  int64_t r = 0;
  for (size_t e = 0; e < counts.size(); e++)
    for (int64_t i = 0; i < counts[e]; i++, r++) {
      for (int64_t f = 0; f < F1; f++) {
        double s = 0;
        for (int64_t k = 0; k < H; k++) s += x_RH.item(r * H + k) * w1.item((e * F1 + f) * H + k);
        h[f] = s;
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
        y.set_item(r * H + k, s);
      }
    }
  return y;
}

}  // namespace moecore::moe
