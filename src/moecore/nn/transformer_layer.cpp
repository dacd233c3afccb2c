// Transformer layer (see transformer_layer.h). Backward of y = h + Z ⊙ f(h): dh = dy + f'(h)ᵀ·(Z ⊙ dy); same for
// x (Z: the site's dropout multipliers, regenerated; ones outside training).
#include "moecore/nn/transformer_layer.h"

#include "moecore/kernels/elementwise.h"
#include "moecore/nn/stash_bytes.h"

namespace moecore::nn {

namespace {
// The layer's norms keep their inputs (the layer's input and the attention block's residual sum) in bf16 under --bf16.
NormConfig layer_norm_config(NormConfig n, LowPrecision low) {
  n.low_stash = low;
  return n;
}
}  // namespace

TransformerLayer::TransformerLayer(ParamRegistry& reg, const std::string& name, const AttentionConfig& attn,
                                   const NormConfig& norm_in, std::unique_ptr<FeedForward> ffn, double hidden_dropout,
                                   bool recompute_norms, const MLAConfig& mla)
    : input_norm_(reg, name + ".input_layernorm", attn.hidden, layer_norm_config(norm_in, attn.low)),
      attn_(mla.enabled ? nullptr : std::make_unique<Attention>(reg, name + ".self_attention", attn)),
      mla_(mla.enabled ? std::make_unique<MLAttention>(reg, name + ".self_attention", attn, mla) : nullptr),
      pre_mlp_norm_(reg, name + ".pre_mlp_layernorm", attn.hidden, layer_norm_config(norm_in, attn.low)),
      ffn_(std::move(ffn)),
      attn_dropout_(name + ".self_attn_bda.hidden_dropout", hidden_dropout, attn.tp),
      mlp_dropout_(name + ".mlp_bda.hidden_dropout", hidden_dropout, attn.tp),
      name_(name),
      recompute_norms_(recompute_norms) {}

TransformerLayer::Stash TransformerLayer::make_stash() const {
  Stash s;
  s.ffn = ffn_->make_stash();
  return s;
}

void TransformerLayer::release(Stash& st) const {
  Stash kept = make_stash();
  kept.dropout = st.dropout;
  kept.ffn->loss_scale = st.ffn->loss_scale;
  ffn_->carry_replay(*st.ffn, *kept.ffn);
  kept.chunk_input = st.chunk_input;
  st = std::move(kept);
}

namespace {
// The dtype a norm writes for a consumer: bf16 (f16) when the consumer's GEMMs read bf16 (f16) (the cast fused into the
// norm).
std::optional<DType> norm_output(LowPrecision low) {
  return low;
}
}  // namespace

std::optional<DType> TransformerLayer::attn_input() const {
  return norm_output(mla_ ? mla_->low_input() : attn_->low_input());
}

std::optional<DType> TransformerLayer::ffn_input() const {
  return norm_output(ffn_->low_input());
}

Tensor TransformerLayer::forward(const Tensor& x_SBH, Stash& st) {
  replaying_ = st.replay;
  const Tensor n1 = input_norm_.forward(x_SBH, st.input_norm, attn_input());
  probe(".input_layernorm", false, n1);
  st.attn.dropout = st.mla.dropout = st.dropout;
  Tensor h = mla_ ? mla_->forward(n1, st.mla) : attn_->forward(n1, st.attn);
  if (recompute_norms_) mla_ ? mla_->drop_input(st.mla) : attn_->drop_input(st.attn);
  probe(".self_attention", false, h);
  attn_dropout_.forward_(h, st.dropout);
  const Tensor n2 = pre_mlp_norm_.forward_add(h, x_SBH, st.pre_mlp_norm, ffn_input());  // h += x first
  probe(".pre_mlp_layernorm", false, n2);
  st.ffn->recompute = st.replay;
  Tensor y = ffn_->forward(n2, *st.ffn);
  st.ffn->recompute = false;
  if (recompute_norms_) ffn_->drop_input(n2, *st.ffn);
  probe(".mlp", false, y);
  mlp_dropout_.forward_(y, st.dropout);
  kernels::add_(y, h);
  replaying_ = false;
  return y;
}

Tensor TransformerLayer::backward(const Tensor& dy_SBH, Stash& st) {
  if (recompute_norms_) {  // the pre-MLP norm's output again, handed back to the FFN's stash
    const Tensor h = Norm::kept_input(st.pre_mlp_norm);
    ffn_->restore_input(pre_mlp_norm_.forward(h, st.pre_mlp_norm, ffn_input()), *st.ffn);
  }
  const Tensor dn2 = ffn_->backward(mlp_dropout_.backward(dy_SBH, st.dropout), *st.ffn);
  probe(".mlp", true, dn2);
  const Tensor dy = dy_SBH.reshape(st.pre_mlp_norm.x.shape());
  Tensor dh = pre_mlp_norm_.backward(dn2, st.pre_mlp_norm, &dy);  // + dy: the residual's gradient
  probe(".pre_mlp_layernorm", true, dh);
  if (recompute_norms_) {  // the input norm's output again, handed back to the attention's stash
    const Tensor x = Norm::kept_input(st.input_norm);
    const Tensor n1 = input_norm_.forward(x, st.input_norm, attn_input());
    mla_ ? mla_->restore_input(n1, st.mla) : attn_->restore_input(n1, st.attn);
  }
  const Tensor dh_attn = attn_dropout_.backward(dh, st.dropout);
  const Tensor dn1 = mla_ ? mla_->backward(dh_attn, st.mla) : attn_->backward(dh_attn, st.attn);
  probe(".self_attention", true, dn1);
  Tensor dx = input_norm_.backward(dn1, st.input_norm, &dh);  // + dh: the residual's gradient
  probe(".input_layernorm", true, dx);
  return dx.reshape(dy_SBH.shape());
}

// What TransformerLayer::forward leaves in its Stash (stash_bytes.h).
int64_t layer_stash_bytes(const AttentionConfig& a, const MLAConfig& m, NormKind norm, bool recompute_norms,
                          int64_t ffn_bytes, const StashDims& d) {
  const int64_t rl = d.local_rows();
  // x, h (the norms' inputs: bf16 under --bf16, bf16_stash); the norms' statistics.
  int64_t b = 2 * tensor_bytes(rl * a.hidden, d.gemm_input()) + 2 * norm_stash_bytes(rl, norm);
  b += m.enabled ? mla_stash_bytes(a, m, d, recompute_norms) : attention_stash_bytes(a, d, recompute_norms);
  return b + ffn_bytes;
}

// What TransformerLayer::release keeps (stash_bytes.h).
int64_t released_layer_stash_bytes(int64_t hidden, bool chunk_begin, const StashDims& d) {
  return chunk_begin ? tensor_bytes(d.local_rows() * hidden, DType::F32) : 0;
}

}  // namespace moecore::nn
