// Dense MLP (see mlp.h).
#include "moecore/nn/mlp.h"

namespace moecore::nn {

MLP::MLP(ParamRegistry& reg, const std::string& name, const MLPConfig& cfg)
    : cfg_(cfg),
      fc1_(reg, name + ".linear_fc1",
           LinearConfig{cfg.hidden, (kernels::is_gated(cfg.activation) ? 2 : 1) * cfg.ffn_hidden, cfg.bias,
                        InitRule::normal(cfg.init_std), cfg.bf16}),
      fc2_(reg, name + ".linear_fc2",
           LinearConfig{cfg.ffn_hidden, cfg.hidden, cfg.bias, InitRule::normal(cfg.output_init_std), cfg.bf16}) {}

Tensor MLP::forward(const Tensor& x_SBH, FeedForward::Stash& base) {
  auto& st = static_cast<Stash&>(base);
  st.h = fc1_.forward(x_SBH, st.fc1);
  Tensor a = Tensor::empty({st.h.rows(), cfg_.ffn_hidden}, st.h.dtype());
  kernels::activation_forward(cfg_.activation, st.h, nullptr, a);
  return fc2_.forward(a, st.fc2).reshape(x_SBH.shape());
}

Tensor MLP::backward(const Tensor& dy_SBH, FeedForward::Stash& base) {
  auto& st = static_cast<Stash&>(base);
  const Tensor da = fc2_.backward(dy_SBH.reshape({dy_SBH.rows(), cfg_.hidden}), st.fc2);
  Tensor dh = Tensor::empty(st.h.shape(), st.h.dtype());
  kernels::activation_backward(cfg_.activation, da, st.h, nullptr, dh, nullptr);
  st.h = Tensor();
  return fc1_.backward(dh, st.fc1).reshape(dy_SBH.shape());
}

}  // namespace moecore::nn
