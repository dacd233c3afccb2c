// Dense MLP (see mlp.h).
#include "moecore/nn/mlp.h"

#include "moecore/nn/stash_bytes.h"
namespace moecore::nn {

namespace {
LinearConfig fc_cfg(const MLPConfig& c, bool fc1) {
  const bool gated = kernels::is_gated(c.activation);
  return LinearConfig{fc1 ? c.hidden : c.ffn_hidden,
                      fc1 ? (gated ? 2 : 1) * c.ffn_hidden : c.hidden,
                      c.bias,
                      InitRule::normal(fc1 ? c.init_std : c.output_init_std),
                      c.low,
                      fc1 ? TPSplit::Column : TPSplit::Row,
                      c.tp,
                      fc1 && gated};
}
}  // namespace

MLP::MLP(ParamRegistry& reg, const std::string& name, const MLPConfig& cfg)
    : cfg_(cfg),
      fc1_(reg, name + ".linear_fc1", fc_cfg(cfg, true)),
      fc2_(reg, name + ".linear_fc2", fc_cfg(cfg, false)) {}

Tensor MLP::forward(const Tensor& x_SBH, FeedForward::Stash& base) {
  auto& st = static_cast<Stash&>(base);
  if (!cfg_.recompute || st.recompute) return forward_impl(x_SBH, st);
  Tensor y = forward_impl(x_SBH, st);
  st.fc1 = st.fc2 = {};
  st.h = Tensor();
  st.x_in = x_SBH;
  return y;
}

Tensor MLP::forward_impl(const Tensor& x_SBH, Stash& st) {
  const Tensor x = sp_all_gather(x_SBH, cfg_.tp);
  // fc1's output in bf16 where the GEMM can round it as it writes (bf16, no bias, CPU), as Megatron keeps it.
  st.h = fc1_.forward(x, st.fc1, h_low(x.device()) ? *cfg_.low : DType::F32);
  // Where fc1 writes h in f32 under bf16 (with a bias, added to the f32 product, or on the GPU) it is rounded before
  // the activation reads it, as Megatron's bf16 fc1 writes it: the activation, its backward and a recompute read the
  // one bf16 h the stash keeps.
  const Tensor h = cfg_.low ? st.h.as_dtype(*cfg_.low) : st.h;
  st.h = h;
  // With bf16 the activation is rounded as it is written: it only feeds fc2's GEMM.
  const DType at = cfg_.low ? *cfg_.low : h.dtype();
  Tensor a = Tensor::empty({h.rows(), fc2_.in()}, at, h.device());
  kernels::activation_forward(cfg_.activation, h, nullptr, a);
  return sp_reduce_scatter(fc2_.forward(a, st.fc2).reshape(x.shape()), cfg_.tp);
}

Tensor MLP::backward(const Tensor& dy_SBH, FeedForward::Stash& base) {
  auto& st = static_cast<Stash&>(base);
  if (st.x_in.defined()) {  // recompute: the forward again, into the stash (the SP all-gather and reduce-scatter too)
    st.recompute = true;
    forward_impl(st.x_in, st);
    st.recompute = false;
    st.x_in = Tensor();
  }
  const Tensor dy = sp_all_gather(dy_SBH, cfg_.tp);
  const Tensor da = fc2_.backward(dy.reshape({dy.rows(), cfg_.hidden}), st.fc2);
  // Likewise its gradient, which only feeds fc1's GEMMs (and, with a bias, fc1's bias gradient: kept f32 then).
  Tensor dh = Tensor::empty(st.h.shape(), cfg_.low && !cfg_.bias ? *cfg_.low : da.dtype(), st.h.device());
  kernels::activation_backward(cfg_.activation, da, st.h, nullptr, dh, nullptr);
  st.h = Tensor();
  return sp_reduce_scatter(fc1_.backward(dh, st.fc1).reshape(dy.shape()), cfg_.tp);
}

void MLP::drop_input(const Tensor& x, FeedForward::Stash& base) const {
  (void)x;
  auto& st = static_cast<Stash&>(base);
  if (cfg_.recompute)
    st.x_in = Tensor();
  else
    st.fc1 = {};
}

void MLP::restore_input(const Tensor& x, FeedForward::Stash& base) const {
  auto& st = static_cast<Stash&>(base);
  if (cfg_.recompute)
    st.x_in = x;
  else
    fc1_.stash_input(sp_all_gather(x, cfg_.tp), st.fc1);
}

// What MLP::forward leaves in its Stash (stash_bytes.h). input_shared: the f32 input x is counted by the caller
// (an MoE layer whose router keeps it too).
int64_t mlp_stash_bytes(const MLPConfig& m, const StashDims& d, bool input_dropped, bool input_shared) {
  const int64_t r = d.rows(), F = m.ffn_hidden / d.tp, F1 = (kernels::is_gated(m.activation) ? 2 : 1) * F;
  const bool own_input = d.low || d.tp > 1;  // a copy (bf16) or the all-gathered input; else the caller's x
  if (m.recompute)                           // the block's input: bf16 when the pre-MLP norm writes it so (low_input)
    return input_dropped || input_shared ? 0 : tensor_bytes(d.local_rows() * m.hidden, d.gemm_input());
  int64_t b = 0;
  if (!input_dropped && (own_input || !input_shared)) b += tensor_bytes(r * m.hidden, d.gemm_input());  // fc1.x
  b += tensor_bytes(r * F1, d.gemm_input());  // h: fc1's output (bf16 under --bf16, written so or rounded)
  b += tensor_bytes(r * F, d.gemm_input());   // fc2.x: the activation (in f32 the tensor itself)
  return b;
}

}  // namespace moecore::nn
