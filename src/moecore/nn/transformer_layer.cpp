// Transformer layer (see transformer_layer.h). Backward of y = h + f(h): dh = dy + f'(h)ᵀ·dy; same for x.
#include "moecore/nn/transformer_layer.h"

#include "moecore/kernels/cpu/elementwise.h"

namespace moecore::nn {

TransformerLayer::TransformerLayer(ParamRegistry& reg, const std::string& name, const AttentionConfig& attn,
                                   double norm_eps, std::unique_ptr<FeedForward> ffn)
    : input_norm_(reg, name + ".input_layernorm", attn.hidden, norm_eps),
      attn_(reg, name + ".self_attention", attn),
      pre_mlp_norm_(reg, name + ".pre_mlp_layernorm", attn.hidden, norm_eps),
      ffn_(std::move(ffn)) {}

TransformerLayer::Stash TransformerLayer::make_stash() const {
  Stash s;
  s.ffn = ffn_->make_stash();
  return s;
}

Tensor TransformerLayer::forward(const Tensor& x_SBH, Stash& st) {
  Tensor h = attn_.forward(input_norm_.forward(x_SBH, st.input_norm), st.attn);
  kernels::add_(h, x_SBH);
  Tensor y = ffn_->forward(pre_mlp_norm_.forward(h, st.pre_mlp_norm), *st.ffn);
  kernels::add_(y, h);
  return y;
}

Tensor TransformerLayer::backward(const Tensor& dy_SBH, Stash& st) {
  Tensor dh = pre_mlp_norm_.backward(ffn_->backward(dy_SBH, *st.ffn), st.pre_mlp_norm);
  kernels::add_(dh, dy_SBH);
  Tensor dx = input_norm_.backward(attn_.backward(dh, st.attn), st.input_norm);
  kernels::add_(dx, dh);
  return dx.reshape(dy_SBH.shape());
}

}  // namespace moecore::nn
