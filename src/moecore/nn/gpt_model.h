// Decoder-only GPT: embedding (+ learned positions) → L transformer layers → final norm → output layer (tied to the
// embedding or its own weight) → cross-entropy. Tokens arrive [B, S] as a loader gives them; activations run [S, B, H].
// Parameter names follow Megatron-Core's GPTModel (embedding.word_embeddings, decoder.layers.i..., output_layer).
// Under pipeline parallelism a GPTModel is one pipeline rank's share: its model chunks (virtual stages), each a run
// of decoder layers at their global indices, the embedding on the first stage's first chunk, the final norm, output
// layer and loss on the last stage's last chunk; hidden states [S/TP, B, H] enter and leave at chunk boundaries.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "moecore/kernels/activation.h"
#include "moecore/nn/context_attention.h"
#include "moecore/nn/layer_recompute.h"
#include "moecore/nn/linear.h"
#include "moecore/nn/mtp.h"
#include "moecore/nn/norm.h"
#include "moecore/nn/position_embedding.h"
#include "moecore/nn/probe.h"
#include "moecore/nn/transformer_layer.h"
#include "moecore/nn/vocab_embedding.h"

namespace moecore::nn {

// One model chunk: decoder layers [first_layer, first_layer + num_layers) at their global indices, with the
// embedding in front (the first pipeline stage) and/or the final norm, output layer and loss behind (the last).
struct ModelChunk {
  int64_t first_layer = 0, num_layers = 0;
  bool embedding = true, loss = true;
};

struct GPTConfig {
  int64_t num_layers = 2;
  int64_t hidden_size = 64;
  int64_t ffn_hidden_size = 256;
  int64_t num_attention_heads = 4;
  int64_t num_query_groups = 4;  // = heads unless grouped-query attention
  int64_t kv_channels = 16;      // head dim
  int64_t vocab_size = 256;
  int64_t max_seq_len = 128;
  double rotary_base = 10000.0;
  double rotary_percent = 1.0;
  bool qk_layernorm = false;
  bool untie_embeddings_and_output_weights = false;
  double norm_eps = 1e-5;
  double init_method_std = 0.02;
  kernels::Activation activation = kernels::Activation::SwiGLU;
  bool add_bias_linear = false;
  LowPrecision low{};  // --bf16 or --fp16: bf16 or f16 GEMM operands and weights with f32 accumulation
  // Tensor parallelism with sequence parallelism: vocabulary-parallel embedding, output layer and cross-entropy;
  // attention heads and FFN columns split; layers run on sequence shards [S/TP, B, H].
  TPContext tp;
  // Dropout in training (Megatron's --hidden-dropout on the embedding output and before each residual add,
  // --attention-dropout on the attention probabilities), masks drawn from `seed` and global coordinates.
  double hidden_dropout = 0, attention_dropout = 0;
  uint64_t seed = 0;
  // Megatron's --normalization, --apply-layernorm-1p and --position-embedding-type. Here the defaults are the
  // Qwen3-style model the nn tests were written for; the flags' defaults (LayerNorm, learned_absolute) are
  // Megatron's (train/config.h).
  NormKind normalization = NormKind::RMSNorm;
  bool zero_centered_gamma = false;
  PositionEmbeddingType position_embedding = PositionEmbeddingType::Rope;
  // Multi-Latent Attention in every layer instead of the attention above (enabled: --multi-latent-attention).
  MLAConfig mla;
  NormConfig norm() const { return {normalization, norm_eps, zero_centered_gamma}; }
  // Multi-token prediction (--mtp-num-layers): its depths after the final norm, on the loss chunk; each depth's FFN
  // from the factory as for the last decoder layer (Megatron's MTP layer spec); losses apart from the LM loss.
  MTPConfig mtp;
  RecomputeConfig recompute;  // activation recompute (the MoE layers take theirs from their own config)
  // This rank's chunks, in virtual-stage order (empty: the whole model, one chunk). Layers keep their global names
  // and initialization; a tied output layer on a last stage without the embedding holds its own copy of the word
  // embedding (Megatron's shared weight, kept equal by summing its gradient over the embedding group).
  std::vector<ModelChunk> chunks;
  // Context parallelism (--context-parallel-size C > 1): forward takes whole sequences [B, S] and keeps this rank's
  // two chunks of each (context_split.h); layers run on [S/(C·TP), B, H]. cp_comm_types: one per layer, or empty
  // (cp.comm_type for every layer).
  ContextParallel cp;
  std::vector<CpCommType> cp_comm_types;
};

// Builds the FFN of layer `i` (a dense MLP, or an MoE layer). nullptr means the dense MLP.
using FfnFactory = std::function<std::unique_ptr<FeedForward>(ParamRegistry&, const std::string&, int64_t)>;

class GPTModel {
 public:
  struct Stash {
    Embedding::Stash emb;
    PositionEmbedding::Stash pos;
    std::vector<TransformerLayer::Stash> layers;
    Norm::Stash final_norm;
    Linear::Stash output;
    Tensor labels_T, mask_T, logits_TV, lse_T;  // logits: this rank's vocabulary columns
    int64_t S = 0, B = 0;
    double mask_sum = 0;
    // Global index of each sequence in the run (the data sampler's consumed-sample index), set before forward:
    // dropout masks depend on it. Empty: 0 .. B−1.
    std::vector<int64_t> sample_B;
    DropoutBatch dropout;  // what forward used; backward regenerates the same masks
    // MTP: the micro-batch's input ids [B, S] (set by forward_chunk on the embedding chunk, else by the caller
    // before the loss chunk's forward) and the depths' stash (losses in mtp.depths[k].loss after loss_forward).
    Tensor tokens_BS;
    MTPBlock::Stash mtp;
    // The backward's token_scale as a function of the micro-batch's loss tokens, where the schedule knows it before
    // forward (set before each forward, which consumes it; empty: unknown). With it, a training loss_forward on one
    // vocabulary shard on the CPU computes the logits' gradient along with the loss
    // (kernels::cross_entropy_forward_backward: each exponential once) and leaves it in logits_TV; backward starts
    // from it (MTP's depths alike).
    std::function<double(double mask_sum)> token_scale_of;
    double grad_token_scale = -1;  // ≥ 0: logits_TV holds their gradient, computed with this token_scale
  };

  GPTModel(const GPTConfig& cfg, ParamRegistry& reg, FfnFactory ffn = nullptr);
  Stash make_stash() const;

  // tokens_BS, labels_BS [B, S] (i32/i64), loss_mask_BS [B, S] (f32/f64 or undefined = all ones).
  // Returns the mean loss over unmasked tokens.
  double forward(const Tensor& tokens_BS, const Tensor& labels_BS, const Tensor& loss_mask_BS, Stash& st);
  // Backpropagates loss_scale · d(mean loss); accumulates parameter gradients. `grads_final(i)` (optional) is
  // called as soon as layer i's gradients are complete, from the last layer down, then with num_layers() once the
  // embedding, final norm and output layer are done: the hook data parallelism starts its reductions from.
  void backward(Stash& st, double loss_scale = 1.0, const std::function<void(size_t)>& grads_final = {});
  // Backpropagates token_scale · d(sum of the masked token losses) + aux_scale · d(MoE aux and z losses): Megatron's
  // --calculate-per-token-loss form (backward is this with token_scale = loss_scale / unmasked tokens).
  void backward_scaled(Stash& st, double token_scale, double aux_scale,
                       const std::function<void(size_t)>& grads_final = {});
  // Logits [S·B, V] (row t = s·B + b, the whole vocabulary on every rank) for generation and evaluation; no stash
  // is kept. Under tensor parallelism any S works (the sequence is padded at its end, which causal attention
  // cannot see).
  Tensor logits(const Tensor& tokens_BS);

  // Pipeline entry points, per chunk c. forward_chunk takes tokens [B, S] (a chunk with the embedding) or the hidden
  // state x [S/TP, B, H] from the previous stage, and returns the hidden state for the next stage, or for the loss
  // chunk the logits (kept in st; loss_forward then gives the mean loss). st.sample_B is set before.
  Tensor forward_chunk(size_t c, const Tensor& in, Stash& st);
  double loss_forward(const Tensor& labels_BS, const Tensor& loss_mask_BS, Stash& st);
  // Backward of chunk c: from the loss (the loss chunk; dy ignored) or from dy [S/TP, B, H] the next stage sent.
  // Returns the input's gradient [S/TP, B, H] (undefined for the embedding chunk). grads_final(global layer) as in
  // backward, for this chunk's layers only.
  Tensor backward_chunk(size_t c, Stash& st, const Tensor& dy, double token_scale, double aux_scale,
                        const std::function<void(size_t)>& grads_final = {});
  size_t num_chunks() const { return chunks_.size(); }
  const ModelChunk& chunk(size_t c) const { return chunks_[c]; }
  // The global index of local layer i; the word embedding (or the last stage's copy), null when not held.
  int64_t global_layer(size_t i) const { return global_layer_[i]; }
  Parameter* word_embedding() const { return embedding_ ? &embedding_->weight() : nullptr; }

  // Training mode (the default) lets MoE layers update aux losses, balancing counters and statistics, and turns
  // dropout on.
  void set_training(bool training);
  // Once per optimizer step, after the gradients are final: every layer's FFN closes its global batch (MoE:
  // expert-bias update and routing-statistics snapshot; collective over the ranks that share the batch).
  void finish_global_batch();
  // Layer i's routing statistics for its last finished global batch; null for a dense layer.
  const RoutingStats* routing_stats(size_t i) const { return layers_[i]->ffn().routing_stats(); }
  // Sees every module's forward output and backward input gradient (probe.h); null: none. The probe must outlive
  // its use.
  void set_probe(const Probe* probe);
  // Megatron's forward pre-hook: called before a forward reads the parameters of global layer i (i), or of the
  // embedding, final norm, output layer and MTP (num_layers of the whole model). The distributed optimizer waits
  // there for the parameter all-gathers it left in flight (--overlap-param-gather). Empty: none.
  void set_forward_pre_hook(std::function<void(size_t)> hook) { pre_hook_ = std::move(hook); }
  // Megatron FSDP's unit hooks beside the pre-hook, with the same unit numbers (empty: none): prefetch(i), i's
  // parameters are read next in this chunk (their gather may start); params_done(i), a forward no longer reads them
  // (a full-recompute chunk's are read again by the replay in its last layer's backward, which calls the pre-hook
  // for each replayed layer first); backward_start(i) before i's backward reads them and writes its gradients (the
  // embedding/output unit's spans the loss's and the embedding's backward when one chunk holds both);
  // backward_done(i) after it, in every micro-batch. With them set the pre-hook of the embedding/output unit is
  // called where each part reads it rather than at the chunk's start.
  struct UnitHooks {
    std::function<void(size_t)> prefetch, params_done, backward_start, backward_done;
  };
  void set_unit_hooks(UnitHooks hooks) { unit_hooks_ = std::move(hooks); }
  // Called in every micro-batch's backward once unit i's parameter gradients for it are written (a layer's after
  // its backward, before grads_final; the embedding/output unit's at the end of the chunk's part of it, once per
  // chunk): where low-precision main gradients are rounded (optim/low_precision_grads.h). Empty: none.
  void set_grads_written_hook(std::function<void(size_t)> hook) { grads_written_ = std::move(hook); }
  // Fine-grained activation offloading of the decoder layers' stashes (stash_offload.h); null: none. It must outlive
  // its use.
  void set_stash_offload(StashOffload* o) { recompute_.set_offload(o); }
  TransformerLayer& layer(size_t i) { return *layers_[i]; }  // local index (global_layer(i) under PP)
  size_t num_layers() const { return layers_.size(); }
  const GPTConfig& config() const { return cfg_; }
  // MTP (null without): the block, and each depth's loss summed over the training micro-batches since the last
  // take_mtp_losses, which returns their means over those micro-batches (Megatron's logged `mtp_k loss`) and resets.
  MTPBlock* mtp() const { return mtp_.get(); }
  std::vector<double> take_mtp_losses();

 private:
  Tensor embed_and_decode(const Tensor& tokens_BS, Stash& st);
  // MTP's backward scale (MTPBlock::backward) for the main loss's token_scale: scale·(factor/D) of a mean over this
  // micro-batch's mask_sum loss tokens. One expression for loss_forward and backward_chunk, so both get its bits.
  double mtp_backward_scale(double token_scale, double mask_sum) const;
  void begin_batch(int64_t S, int64_t B, Stash& st);
  GPTConfig cfg_;
  std::vector<ModelChunk> chunks_;
  std::vector<size_t> chunk_begin_;  // first local layer of each chunk
  std::vector<int64_t> global_layer_;
  std::unique_ptr<Embedding> embedding_;  // first stage; a tied last stage's copy
  bool has_embedding_ = false, has_loss_ = false;
  std::vector<std::unique_ptr<TransformerLayer>> layers_;
  std::unique_ptr<PositionEmbedding> position_;  // learned_absolute only
  std::unique_ptr<Norm> final_norm_;
  int64_t vocab_start_ = 0;  // this rank's first vocabulary column
  std::unique_ptr<Linear> output_;
  HiddenDropout embedding_dropout_;
  LayerRecompute recompute_;
  std::unique_ptr<MTPBlock> mtp_;  // the loss chunk's
  std::vector<double> mtp_loss_sums_;
  int64_t mtp_micro_batches_ = 0;
  bool training_ = true;
  const Probe* probe_ = nullptr;
  std::function<void(size_t)> pre_hook_;
  void pre_hook(size_t layer) const {
    if (pre_hook_) pre_hook_(layer);
  }
  UnitHooks unit_hooks_;
  std::function<void(size_t)> grads_written_;
  bool units() const { return static_cast<bool>(unit_hooks_.backward_done); }
  static void call(const std::function<void(size_t)>& hook, size_t unit) {
    if (hook) hook(unit);
  }
  void probe(const char* module, bool backward, const Tensor& t) const {
    if (probe_) (*probe_)(module, backward, t);
  }
};

// Converts [B, S] integer tokens to the sequence-major [S·B] order the model runs in.
Tensor to_sequence_major(const Tensor& x_BS);

}  // namespace moecore::nn
