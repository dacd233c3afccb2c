// Multi-token prediction (Megatron's MultiTokenPredictionBlock, DeepSeek-V3's MTP modules): depth k = 1..D predicts
// the token k+1 positions ahead. h_k = final_layernorm_k(Layer_k(eh_proj_k([enorm_k(emb(tok rolled k)) ‖
// hnorm_k(h_{k−1})]))) with h_0 the main model's final-normed hidden state; logits_k = output_layer(h_k) with the
// main model's (shared) embedding and output layer. Not here: the main loss, pipeline placement (gpt_model.cpp).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "moecore/nn/context_attention.h"
#include "moecore/nn/dropout_sites.h"
#include "moecore/nn/linear.h"
#include "moecore/nn/norm.h"
#include "moecore/nn/transformer_layer.h"
#include "moecore/nn/vocab_embedding.h"

namespace moecore::nn {

struct MTPConfig {
  int64_t num_layers = 0;            // D (--mtp-num-layers); 0: no MTP
  double loss_scaling_factor = 0.1;  // --mtp-loss-scaling-factor
  // --recompute-granularity full --recompute-method uniform (Megatron's MTP _checkpointed_forward): each depth keeps
  // the inputs of its enorm/hnorm, eh_proj and transformer layer, and re-runs them in backward.
  bool recompute = false;
};

// Megatron's roll_tensor(shifts=−1) applied k times along the sequence: x'[s] = x[s+k] for s < S−k, else 0.
// x_T is sequence-major [S·B] (t = s·B + b), i64 ids or f32/f64 values.
Tensor roll_sequence(const Tensor& x_T, int64_t S, int64_t B, int64_t k);
// The whole sequence's x_T [S·C·B] rolled k, at this context-parallel rank's S local positions -> [S·B]: Megatron's
// roll_tensor with its CP boundary exchange, from the whole sequence every CP rank holds.
Tensor roll_local(const Tensor& x_T, int64_t S, int64_t B, int64_t k, const ContextParallel& cp);

class MTPBlock {
 public:
  struct Depth {
    Embedding::Stash emb;
    Norm::Stash enorm, hnorm, final_norm;
    Linear::Stash eh_proj, output;
    TransformerLayer::Stash layer;
    Tensor h_SBH;       // this depth's output h_k (this rank's sequence shard)
    Tensor e_in, h_in;  // recompute: the embedding (after dropout) and h_{k−1} it re-runs from
    Tensor labels_T, mask_T, logits_TV, lse_T;  // labels and mask rolled k; logits: this rank's vocab columns
    double mask_sum = 0, loss = 0;  // loss: Σ mask·ce / max(1, Σ mask) (Megatron's logged value); mask_sum: weight
    double grad_scale = -1;         // ≥ 0: logits_TV holds their gradient, computed with this backward scale
  };
  struct Stash {
    std::vector<Depth> depths;
    int64_t S = 0, B = 0;
    DropoutBatch dropout;
  };

  // ffn: one per depth, built by the caller from the last decoder layer's spec (Megatron's MTP layer spec).
  MTPBlock(ParamRegistry& reg, const MTPConfig& cfg, int64_t hidden, const AttentionConfig& attn,
           const NormConfig& norm, const MLAConfig& mla, double hidden_dropout, bool recompute_norms,
           std::vector<std::unique_ptr<FeedForward>> ffn, double init_std, LowPrecision low, TPContext tp);
  Stash make_stash() const;
  const MTPConfig& config() const { return cfg_; }

  // h0_SBH [S/TP, B, H] (the main final norm's output; S: this CP rank's positions), tokens_T [S·C·B] the whole
  // sequence's ids, sequence-major: runs every depth, keeping each depth's logits [S·B, V/TP] (output: the main
  // model's output layer) in st.
  void forward(const Tensor& h0_SBH, const Tensor& tokens_T, int64_t S, int64_t B, Embedding& emb, Linear& output,
               const DropoutBatch& dropout, Stash& st);
  // Each depth's loss with labels and mask rolled by k (labels_T, mask_T: the main ones of the whole sequence,
  // [S·C·B] sequence-major; main_mask_sum: Σ of this rank's main loss mask). Under CP the logged loss is the whole
  // sequence's mean (summed over CP), and each rank's gradient weight is its share of the whole sequence's rolled
  // tokens, so the MTP loss, like the main one, does not depend on C (Megatron normalises by local counts there).
  // backward_scale ≥ 0: the scale backward will be given, known now: on one vocabulary shard each depth's logits
  // are replaced by their gradient along with the loss (kernels::cross_entropy_forward_backward).
  void loss(const Tensor& labels_T, const Tensor& mask_T, double main_mask_sum, int64_t S, int64_t B,
            int64_t vocab_start, int64_t vocab_size, Stash& st, double backward_scale = -1) const;
  // Backpropagates scale·Σ_k (Σ_t mask_k·ce_k / max(1, Σ mask_k)) (scale: factor/D times the main loss's scale of
  // a mean loss); accumulates into every parameter (the shared embedding and output layer too) and returns
  // the gradient of h0 [S/TP, B, H].
  Tensor backward(Stash& st, double scale, int64_t vocab_start, Embedding& emb, Linear& output);

  TransformerLayer& layer(size_t k) { return *layers_[k]; }
  // One depth's checkpointed part (Megatron's _proj_and_transformer_layer): enorm(e) ‖ hnorm(h) -> eh_proj -> the
  // transformer layer, into d's stashes.
  Tensor proj_and_layer(size_t k, const Tensor& e, const Tensor& h, Depth& d);
  size_t num_layers() const { return layers_.size(); }

 private:
  MTPConfig cfg_;
  int64_t hidden_ = 0;
  TPContext tp_;
  ContextParallel cp_;
  std::vector<std::unique_ptr<Norm>> enorm_, hnorm_, final_norm_;
  std::vector<std::unique_ptr<Linear>> eh_proj_;
  std::vector<std::unique_ptr<TransformerLayer>> layers_;
  std::vector<HiddenDropout> emb_dropout_;
};

}  // namespace moecore::nn
