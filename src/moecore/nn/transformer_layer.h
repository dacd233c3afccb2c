// Pre-norm transformer layer: h = x + Attention(Norm(x));  y = h + FFN(Norm(h)) (Norm: RMSNorm or LayerNorm). The FFN
// slot holds a dense MLP or an MoE layer. In training, hidden dropout drops elements of each block's output before
// its residual add (Megatron's bias-dropout-add; the linears here carry no bias into it).
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "moecore/nn/dropout_sites.h"
#include "moecore/nn/feed_forward.h"
#include "moecore/nn/mla_attention.h"
#include "moecore/nn/norm.h"
#include "moecore/nn/offloaded_stash.h"
#include "moecore/nn/probe.h"
#include "moecore/nn/self_attention.h"

namespace moecore::nn {

class TransformerLayer {
 public:
  struct Stash {
    Norm::Stash input_norm, pre_mlp_norm;
    Attention::Stash attn;
    MLAttention::Stash mla;
    std::unique_ptr<FeedForward::Stash> ffn;
    DropoutBatch dropout;  // set by the caller before forward (the model: training flag, seed, sample indices)
    // Full recompute (layer_recompute.h): the input of the chunk this layer begins; and, set by the caller, that
    // this forward is a replay (no probes; the FFN replays its router and counts nothing).
    Tensor chunk_input;
    bool replay = false;
    OffloadedStash offloaded;  // fine-grained activation offloading (stash_offload.h): what is in host memory
  };

  // recompute_norms: --recompute-modules layernorm (both norms' outputs dropped after their consumers' forward,
  // recomputed from the norms' inputs before their consumers' backward).
  TransformerLayer(ParamRegistry& reg, const std::string& name, const AttentionConfig& attn, const NormConfig& norm,
                   std::unique_ptr<FeedForward> ffn, double hidden_dropout = 0, bool recompute_norms = false,
                   const MLAConfig& mla = {});
  Stash make_stash() const;
  Tensor forward(const Tensor& x_SBH, Stash& st);
  Tensor backward(const Tensor& dy_SBH, Stash& st);
  // Full recompute: drops everything forward stashed but the dropout batch and what a replay needs.
  void release(Stash& st) const;
  // Called after each module (see probe.h); null: none.
  void set_probe(const Probe* probe) { probe_ = probe; }
  FeedForward& ffn() { return *ffn_; }
  const FeedForward& ffn() const { return *ffn_; }

 private:
  Norm input_norm_;
  std::unique_ptr<Attention> attn_;  // one of the two
  std::unique_ptr<MLAttention> mla_;
  Norm pre_mlp_norm_;
  std::unique_ptr<FeedForward> ffn_;
  HiddenDropout attn_dropout_, mlp_dropout_;
  std::string name_;
  bool recompute_norms_ = false;
  const Probe* probe_ = nullptr;
  bool replaying_ = false;
  // What the norms write for the attention and the FFN (see norm_output in the .cpp).
  std::optional<DType> attn_input() const;
  std::optional<DType> ffn_input() const;  // during a replay forward: no probes
  void probe(const char* module, bool backward, const Tensor& t) const {
    if (probe_ && !replaying_) (*probe_)(name_ + module, backward, t);
  }
};

}  // namespace moecore::nn
