// Shared experts (see shared_experts.h). With g_t = σ(x_t·w): y_t = m_t·g_t, where m = MLP(x);
//   dm_t = dy_t·g_t;  dz_t = (Σ_h dy_th·m_th)·g_t·(1 − g_t);  dw += Σ_t dz_t·x_t;  dx_t += dz_t·w
#include "moecore/moe/shared_experts.h"

#include "moecore/kernels/elementwise.h"
#include "moecore/kernels/gemm.h"
#include "moecore/kernels/shared_gate.h"
#include "moecore/moe/moe_layer.h"
#include "moecore/nn/stash_bytes.h"

namespace moecore::moe {

SharedExperts::SharedExperts(nn::ParamRegistry& reg, const std::string& name, const nn::MLPConfig& cfg, bool gate,
                             bool recompute)
    : recompute_(recompute), low_(cfg.low), mlp_(reg, name, cfg) {
  if (gate) gate_ = &reg.add(name + ".gate_weight", {1, cfg.hidden}, nn::InitRule::normal(cfg.init_std));
}

SharedExperts::Stash SharedExperts::make_stash() const {
  Stash s;
  s.mlp = mlp_.make_stash();
  return s;
}

Tensor SharedExperts::forward(const Tensor& x_SBH, Stash& st, bool replay) {
  if (!recompute_ || replay) return forward_impl(x_SBH, st);
  Tensor y = forward_impl(x_SBH, st);
  st = make_stash();
  st.x_in = x_SBH;
  return y;
}

void SharedExperts::drop_input(const Tensor& x, Stash& st) const {
  if (st.x_in.defined()) {
    st.x_in = Tensor();
    return;
  }
  mlp_.drop_input(x, *st.mlp);
  st.x_TH = Tensor();
}

void SharedExperts::restore_input(const Tensor& x, Stash& st) const {
  if (recompute_) {
    st.x_in = x;
    return;
  }
  mlp_.restore_input(x, *st.mlp);
  if (gate_) st.x_TH = kept(x.reshape({x.rows(), x.cols()}));
}

Tensor SharedExperts::kept(const Tensor& t) const {
  return low_ ? t.as_dtype(*low_) : t;
}

Tensor SharedExperts::forward_impl(const Tensor& x_SBH, Stash& st) {
  Tensor m = mlp_.forward(x_SBH, *st.mlp);
  if (!gate_) return m;
  const int64_t T = x_SBH.rows(), H = x_SBH.cols();
  const Tensor x_TH = x_SBH.reshape({T, H}), m_TH = m.reshape({T, H});
  st.gate_T = Tensor::empty({T, 1}, x_SBH.dtype(), x_SBH.device());
  kernels::gemm(x_TH, false, gate_->value, true, st.gate_T);
  Tensor y = Tensor::empty({T, H}, x_SBH.dtype(), x_SBH.device());
  kernels::shared_gate_forward(st.gate_T, m_TH, y);
  st.x_TH = kept(x_TH);  // backward reads them widened
  st.out_TH = kept(m_TH);
  return y.reshape(x_SBH.shape());
}

Tensor SharedExperts::backward(const Tensor& dy_SBH, Stash& st) {
  if (st.x_in.defined()) {  // recompute: the forward again, into the stash
    const Tensor x = st.x_in;
    st = make_stash();
    st.mlp->recompute = true;
    forward_impl(x, st);
    st.mlp->recompute = false;
  }
  if (!gate_) return mlp_.backward(dy_SBH, *st.mlp);
  const int64_t T = dy_SBH.rows(), H = dy_SBH.cols();
  Tensor dm = Tensor::empty({T, H}, dy_SBH.dtype(), dy_SBH.device());
  Tensor dz = Tensor::empty({T, 1}, dy_SBH.dtype(), dy_SBH.device());
  const DType dt = dy_SBH.dtype();
  kernels::shared_gate_backward(dy_SBH, st.gate_T, st.out_TH.as_dtype(dt), dm, dz);
  kernels::gemm(dz, true, st.x_TH.as_dtype(dt), false, gate_->grad, 1.0f, gate_->take_grad_beta());
  Tensor dx = mlp_.backward(dm.reshape(dy_SBH.shape()), *st.mlp).reshape({T, H});
  kernels::gemm(dz, false, gate_->value, false, dx, 1.0f, 1.0f);
  st.x_TH = st.out_TH = st.gate_T = Tensor();
  return dx.reshape(dy_SBH.shape());
}

// What SharedExperts::forward leaves in its Stash (nn/stash_bytes.h): the MLP's, and with the gate its output and
// gate values; only the input (the MoE layer's, counted there) under shared_experts recompute.
int64_t shared_experts_stash_bytes(const MoELayerConfig& c, const nn::StashDims& d, bool input_dropped) {
  if (c.shared_ffn_hidden <= 0 || c.recompute_shared_experts) return 0;
  const nn::MLPConfig mc{c.router.hidden, c.shared_ffn_hidden, c.activation, false, 0, 0, c.low, {}};
  int64_t b = nn::mlp_stash_bytes(mc, d, input_dropped, /*input_shared=*/true);
  const int64_t TH = d.local_rows() * c.router.hidden;
  // The gate: the MLP's output and gate values; under bf16 its own bf16 x (in f32 the MoE layer's input).
  if (c.shared_expert_gate)
    b += nn::tensor_bytes(TH, d.gemm_input()) + nn::tensor_bytes(d.local_rows(), DType::F32) +
         (c.low && !input_dropped ? nn::tensor_bytes(TH, *c.low) : 0);
  return b;
}

}  // namespace moecore::moe
