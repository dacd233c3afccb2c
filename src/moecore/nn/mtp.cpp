// Multi-token prediction (see mtp.h). Backward accumulates into parameter gradients. Depth k's gradient:
// d(scale · Σ mask_k·ce_k / Σ mask_k) through the shared output layer and final_layernorm_k, plus what depth k+1
// sends back through hnorm_{k+1}; the layer, eh_proj, then the concat split: the embedding half through enorm_k and
// the (shared) embedding, the hidden half through hnorm_k to depth k−1 (depth 0: the main model's final norm).
#include "moecore/nn/mtp.h"

#include "moecore/kernels/cross_entropy.h"
#include "moecore/kernels/elementwise.h"
#include "moecore/nn/context_split.h"
#include "moecore/nn/stash_bytes.h"
#include "moecore/nn/tensor_parallel.h"

namespace moecore::nn {

namespace {
// [rows, H] ‖ [rows, H] -> [rows, 2H] (Megatron's torch.cat((embedding, hidden), -1)).
Tensor concat_cols(const Tensor& a, const Tensor& b, int64_t rows, int64_t H) {
  MOE_ASSERT(a.numel() == rows * H && b.numel() == rows * H && a.dtype() == b.dtype() && a.device() == b.device());
  Tensor y = Tensor::empty({rows, 2 * H}, a.dtype(), a.device());
  kernels::copy_cols(a, H, 0, y, 2 * H, 0, rows, H);
  kernels::copy_cols(b, H, 0, y, 2 * H, H, rows, H);
  return y;
}
// The adjoint: [rows, 2H] -> its two halves [rows, H].
void split_cols(const Tensor& y, int64_t rows, int64_t H, Tensor& a, Tensor& b) {
  MOE_ASSERT(y.numel() == rows * 2 * H);
  a = Tensor::empty({rows, H}, y.dtype(), y.device());
  b = Tensor::empty({rows, H}, y.dtype(), y.device());
  kernels::copy_cols(y, 2 * H, 0, a, H, 0, rows, H);
  kernels::copy_cols(y, 2 * H, H, b, H, 0, rows, H);
}
}  // namespace

Tensor roll_sequence(const Tensor& x_T, int64_t S, int64_t B, int64_t k) {
  MOE_ASSERT(x_T.numel() == S * B && k >= 0);
  Tensor y = Tensor::zeros({S * B}, x_T.dtype(), x_T.device());
  // Rows k.. of x are contiguous, and so are rows ..S−k of y: one copy.
  if (k < S) y.slice(0, (S - k) * B).copy_from(x_T.reshape({S * B}).slice(k * B, (S - k) * B));
  return y;
}

namespace {
// This CP rank's S positions of a whole sequence's x_T [S·C·B] (sequence-major).
Tensor local_rows(const Tensor& x_T, int64_t S, int64_t B, const ContextParallel& cp) {
  return rows_at_positions(x_T.reshape({S * cp.size, B}), S, SeqSplit{cp.size, cp.rank}).reshape({S * B});
}
}  // namespace

Tensor roll_local(const Tensor& x_T, int64_t S, int64_t B, int64_t k, const ContextParallel& cp) {
  Tensor r = roll_sequence(x_T, S * cp.size, B, k);
  return cp.on() ? local_rows(r, S, B, cp) : r;
}

MTPBlock::MTPBlock(ParamRegistry& reg, const MTPConfig& cfg, int64_t hidden, const AttentionConfig& attn,
                   const NormConfig& norm, const MLAConfig& mla, double hidden_dropout, bool recompute_norms,
                   std::vector<std::unique_ptr<FeedForward>> ffn, double init_std, LowPrecision low, TPContext tp)
    : cfg_(cfg), hidden_(hidden), tp_(tp), cp_(attn.cp) {
  MOE_ASSERT(static_cast<int64_t>(ffn.size()) == cfg.num_layers);
  NormConfig kept_norm = norm;  // the depth's norms keep their inputs in bf16 under --bf16
  kept_norm.low_stash = low;
  for (int64_t k = 0; k < cfg.num_layers; k++) {
    const std::string name = "mtp.layers." + std::to_string(k);
    enorm_.push_back(std::make_unique<Norm>(reg, name + ".enorm", hidden, kept_norm));
    hnorm_.push_back(std::make_unique<Norm>(reg, name + ".hnorm", hidden, kept_norm));
    // Replicated over TP and run on the sequence shard: the same values as Megatron's column-parallel eh_proj
    // followed by its gather and scatter (its gradient is summed over TP like every replicated parameter's).
    eh_proj_.push_back(std::make_unique<Linear>(
        reg, name + ".eh_proj",
        LinearConfig{2 * hidden, hidden, false, InitRule::normal(init_std), low, TPSplit::None, tp}));
    layers_.push_back(std::make_unique<TransformerLayer>(reg, name + ".mtp_model_layer", attn, norm,
                                                         std::move(ffn[static_cast<size_t>(k)]), hidden_dropout,
                                                         recompute_norms, mla));
    final_norm_.push_back(std::make_unique<Norm>(reg, name + ".final_layernorm", hidden, kept_norm));
    emb_dropout_.emplace_back(name + ".embedding_dropout", hidden_dropout, tp);
  }
}

MTPBlock::Stash MTPBlock::make_stash() const {
  Stash s;
  for (const auto& l : layers_) {
    s.depths.emplace_back();
    s.depths.back().layer = l->make_stash();
  }
  return s;
}

void MTPBlock::forward(const Tensor& h0_SBH, const Tensor& tokens_T, int64_t S, int64_t B, Embedding& emb,
                       Linear& output, const DropoutBatch& dropout, Stash& st) {
  const int64_t SL = S / tp_.size(), H = hidden_, rows = SL * B;
  MOE_ASSERT(h0_SBH.numel() == rows * H && tokens_T.numel() == S * cp_.size * B);
  st.S = S;
  st.B = B;
  st.dropout = dropout;
  Tensor h = h0_SBH.reshape({SL, B, H});
  const Device emb_device = emb.weight().value.device();
  for (size_t k = 0; k < layers_.size(); k++) {
    Depth& d = st.depths[k];
    // Megatron rolls the input ids once per depth (the last positions read token 0).
    // The ids are rolled where they are (the host, as the batch arrives) and then follow the embedding's weights.
    const Tensor ids_T = roll_local(tokens_T, S, B, static_cast<int64_t>(k) + 1, cp_).to(emb_device);
    Tensor e = emb.forward(ids_T, d.emb).reshape({SL, B, H});
    emb_dropout_[k].forward_(e, dropout);
    d.layer.dropout = dropout;
    const Tensor y = proj_and_layer(k, e, h, d);
    if (cfg_.recompute) {  // keep only the inputs: the stashes are filled again in backward
      d.e_in = e, d.h_in = h;
      d.enorm = {}, d.hnorm = {}, d.eh_proj = {};
      layers_[k]->release(d.layer);
    }
    h = final_norm_[k]->forward(y, d.final_norm);
    const Tensor x = sp_all_gather(h, tp_);
    d.logits_TV = output.forward(x, d.output, output.low_output_where_possible(x.device()));  // as the main ones
  }
}

Tensor MTPBlock::proj_and_layer(size_t k, const Tensor& e, const Tensor& h, Depth& d) {
  const int64_t SL = h.dim(0), B = h.dim(1), H = hidden_, rows = SL * B;
  const Tensor en = enorm_[k]->forward(e, d.enorm), hn = hnorm_[k]->forward(h, d.hnorm);
  const Tensor x = eh_proj_[k]->forward(concat_cols(en, hn, rows, H), d.eh_proj).reshape({SL, B, H});
  return layers_[k]->forward(x, d.layer);
}

namespace {
// The upstream gradient of a depth's token losses for backward scale `scale`: mask·scale/mask_sum.
Tensor depth_dloss(const MTPBlock::Depth& d, double scale) {
  Tensor dloss = d.mask_T.clone();
  kernels::scale_(dloss, d.mask_sum > 0 ? scale / d.mask_sum : 0.0);
  return dloss;
}
}  // namespace

void MTPBlock::loss(const Tensor& labels_T, const Tensor& mask_T, double main_mask_sum, int64_t S, int64_t B,
                    int64_t vocab_start, int64_t vocab_size, Stash& st, double backward_scale) const {
  const int64_t T = S * B;
  const double main_all = cp_.on() ? kernels::sum(mask_T) : main_mask_sum;  // the whole sequence's loss tokens
  for (size_t k = 0; k < st.depths.size(); k++) {
    Depth& d = st.depths[k];
    const DType dt = kernels::cross_entropy_stats_dtype(d.logits_TV.dtype());
    const Device dev = d.logits_TV.device();  // labels and mask are rolled where they are, used where the logits are
    const int64_t shift = static_cast<int64_t>(k) + 1;
    d.labels_T = roll_local(labels_T, S, B, shift, cp_).to(dev);
    const Tensor mask_rolled = roll_sequence(mask_T, S * cp_.size, B, shift);  // the whole sequence's
    d.mask_T = (cp_.on() ? local_rows(mask_rolled, S, B, cp_) : mask_rolled).to(dev);
    Tensor loss_T = Tensor::empty({T}, dt, dev);
    d.lse_T = Tensor::empty({T}, dt, dev);
    // The depth's gradient weight: its loss tokens, or under CP this rank's share of the whole sequence's rolled
    // tokens (see the header).
    const double tokens = cp_.on() ? kernels::sum(mask_rolled) : 0.0;
    d.mask_sum = !cp_.on() ? kernels::sum(d.mask_T) : main_all > 0 ? tokens * main_mask_sum / main_all : 0.0;
    d.grad_scale = -1;
    if (backward_scale >= 0 && !tp_.on()) {
      kernels::cross_entropy_forward_backward(d.logits_TV, d.labels_T, depth_dloss(d, backward_scale), loss_T, d.lse_T);
      d.grad_scale = backward_scale;
    } else if (tp_.on()) {
      const comm::ProcessGroup& g = *tp_.group;
      kernels::cross_entropy_forward_vocab_parallel(
          d.logits_TV, d.labels_T, vocab_start, vocab_size,
          [&g](Tensor& t, bool max) { g.all_reduce(t, max ? comm::ReduceOp::Max : comm::ReduceOp::Sum); }, loss_T,
          d.lse_T);
    } else {
      kernels::cross_entropy_forward(d.logits_TV, d.labels_T, loss_T, d.lse_T);
    }
    if (!cp_.on()) {
      d.loss = d.mask_sum > 0 ? kernels::dot(loss_T, d.mask_T) / d.mask_sum : 0.0;
      continue;
    }
    // CP: the loss summed over the CP ranks, over the rolled tokens of the whole sequence.
    Tensor sum = Tensor::empty({1}, DType::F64);
    sum.set_item(0, kernels::dot(loss_T, d.mask_T));
    cp_.group->all_reduce(sum);
    d.loss = tokens > 0 ? sum.item(0) / tokens : 0.0;
  }
}

Tensor MTPBlock::backward(Stash& st, double scale, int64_t vocab_start, Embedding& emb, Linear& output) {
  const int64_t S = st.S, B = st.B, SL = S / tp_.size(), H = hidden_, rows = SL * B;
  Tensor dh_next;  // d h_k through depth k+1's hnorm
  for (size_t k = layers_.size(); k-- > 0;) {
    Depth& d = st.depths[k];
    if (d.grad_scale >= 0)  // computed with the loss
      MOE_ASSERT_MSG(d.grad_scale == scale, "MTP depth {}'s logits' gradient has scale {}, not {}", k + 1, d.grad_scale,
                     scale);
    else
      kernels::cross_entropy_backward(depth_dloss(d, scale), d.logits_TV, d.labels_T, d.lse_T, d.logits_TV,
                                      vocab_start);
    d.grad_scale = -1;
    Tensor dh = output.backward(d.logits_TV, d.output);
    d.logits_TV = Tensor();
    dh = sp_reduce_scatter(dh.reshape({S, B, H}), tp_);
    if (dh_next.defined()) kernels::add_(dh, dh_next.reshape({SL, B, H}));
    const Tensor dy = final_norm_[k]->backward(dh, d.final_norm);
    if (cfg_.recompute) {  // the checkpointed part again (a replay: no statistics counted twice)
      d.layer.replay = true;
      proj_and_layer(k, d.e_in, d.h_in, d);
      d.layer.replay = false;
      d.e_in = d.h_in = Tensor();
    }
    const Tensor dx = layers_[k]->backward(dy, d.layer);
    Tensor de, dhn;
    split_cols(eh_proj_[k]->backward(dx.reshape({rows, H}), d.eh_proj), rows, H, de, dhn);
    Tensor den = enorm_[k]->backward(de.reshape({SL, B, H}), d.enorm);
    den = emb_dropout_[k].backward(den, st.dropout);
    emb.backward(den.reshape({rows, H}), d.emb);
    dh_next = hnorm_[k]->backward(dhn.reshape({SL, B, H}), d.hnorm);
  }
  return dh_next;
}

int64_t mtp_depth_stash_bytes(int64_t hidden, int64_t padded_vocab, NormKind norm, const StashDims& d, bool recompute,
                              int64_t layer) {
  const int64_t rl = d.local_rows(), H = hidden;
  int64_t b = embedding_stash_bytes(d);
  if (recompute)
    b += 2 * tensor_bytes(rl * H, DType::F32);  // e_in, h_in: f32, the replay's inputs
  else  // enorm's and hnorm's inputs (bf16 under --bf16) and statistics, eh_proj's input, the layer
    b += 2 * (tensor_bytes(rl * H, d.gemm_input()) + norm_stash_bytes(rl, norm)) +
         tensor_bytes(rl * 2 * H, d.gemm_input()) + layer;
  return b + loss_stash_bytes(hidden, padded_vocab, norm, d);  // final norm, output input, logits, labels/mask/lse
}

}  // namespace moecore::nn
