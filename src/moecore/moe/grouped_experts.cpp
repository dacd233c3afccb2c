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
    st.x_RH = x_RH.to(DType::BF16);
  } else {
    st.x_RH = x_RH;
  }
  st.h_RF1 = Tensor::empty({R, F1}, dt);
  for_each_expert(counts, [&](int64_t e, int64_t r0, int64_t n) {
    Tensor h = st.h_RF1.slice(r0, n);
    kernels::gemm_dynamic(st.x_RH.slice(r0, n), false, expert_weight(*w1, e), true, h);
  });
  Tensor a = Tensor::empty({R, F}, dt);
  kernels::activation_forward(cfg_.activation, st.h_RF1, &probs_R, a);
  st.a_RF = cfg_.bf16 ? a.to(DType::BF16) : a;
  Tensor y = Tensor::empty({R, H}, dt);
  for_each_expert(counts, [&](int64_t e, int64_t r0, int64_t n) {
    Tensor yr = y.slice(r0, n);
    kernels::gemm_dynamic(st.a_RF.slice(r0, n), false, expert_weight(*w2, e), true, yr);
  });
  return y;
}

Tensor GroupedExperts::backward(const Tensor& dy_RH, Stash& st, Tensor& dprobs_R) {
  const int64_t R = dy_RH.rows(), H = cfg_.hidden, F = cfg_.ffn_hidden;
  const DType dt = fc1_->value.dtype();
  const std::vector<int64_t>& counts = st.tokens_per_expert;
  const Tensor dy = cfg_.bf16 ? dy_RH.to(DType::BF16) : dy_RH;
  const Tensor& w1 = cfg_.bf16 ? w1_bf16_ : fc1_->value;
  const Tensor& w2 = cfg_.bf16 ? w2_bf16_ : fc2_->value;
  Tensor da = Tensor::empty({R, F}, dt);
  for_each_expert(counts, [&](int64_t e, int64_t r0, int64_t n) {
    Tensor dar = da.slice(r0, n);
    kernels::gemm_dynamic(dy.slice(r0, n), false, expert_weight(w2, e), false, dar);
    Tensor dw2 = expert_weight(fc2_->grad, e);
    kernels::gemm_dynamic(dy.slice(r0, n), true, st.a_RF.slice(r0, n), false, dw2, 1.0f, 1.0f);
  });
  Tensor dh = Tensor::empty(st.h_RF1.shape(), dt);
  dprobs_R = Tensor::empty({R}, dt);
  kernels::activation_backward(cfg_.activation, da, st.h_RF1, &st.probs_R, dh, &dprobs_R);
  const Tensor dhc = cfg_.bf16 ? dh.to(DType::BF16) : dh;
  Tensor dx = Tensor::empty({R, H}, dt);
  for_each_expert(counts, [&](int64_t e, int64_t r0, int64_t n) {
    Tensor dxr = dx.slice(r0, n);
    kernels::gemm_dynamic(dhc.slice(r0, n), false, expert_weight(w1, e), false, dxr);
    Tensor dw1 = expert_weight(fc1_->grad, e);
    kernels::gemm_dynamic(dhc.slice(r0, n), true, st.x_RH.slice(r0, n), false, dw1, 1.0f, 1.0f);
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
