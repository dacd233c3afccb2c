// GPT model (see gpt_model.h). Loss = Σ_t mask_t·ce_t / Σ_t mask_t, so dloss_t = scale·mask_t / Σ mask.
#include "moecore/nn/gpt_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "moecore/kernels/backend.h"
#include "moecore/kernels/cross_entropy.h"
#include "moecore/kernels/elementwise.h"
#include "moecore/nn/mlp.h"
#include "moecore/nn/stash_bytes.h"

namespace moecore::nn {

namespace {
// y[s·B + b] = x[b·S + s], converted to the output type.
template <typename Out, typename In>
void transpose_bs(const In* x, Out* y, int64_t B, int64_t S) {
  for (int64_t b = 0; b < B; b++)
    for (int64_t s = 0; s < S; s++) y[s * B + b] = static_cast<Out>(x[b * S + s]);
}

// The loss mask [B, S] (f32 or f64; undefined: every token) as [S·B] of dtype dt, sequence-major.
Tensor mask_sequence_major(const Tensor& mask_BS, const Tensor& labels_BS, DType dt) {
  const int64_t B = labels_BS.dim(0), S = labels_BS.dim(1);
  Tensor m = Tensor::empty({S * B}, dt);
  if (!mask_BS.defined()) {
    kernels::fill_(m, 1.0);
    return m;
  }
  MOE_ASSERT(mask_BS.shape() == labels_BS.shape());
  MOE_DISPATCH_FLOAT(dt, T, {
    if (mask_BS.dtype() == DType::F32)
      transpose_bs(mask_BS.data<float>(), m.data<T>(), B, S);
    else
      transpose_bs(mask_BS.data<double>(), m.data<T>(), B, S);
  });
  return m;
}
}  // namespace

Tensor to_sequence_major(const Tensor& x_BS) {
  MOE_ASSERT_MSG(x_BS.ndim() == 2, "expected [B, S], got {}", x_BS.shape().str());
  MOE_ASSERT_MSG(x_BS.dtype() == DType::I32 || x_BS.dtype() == DType::I64, "token ids are i32 or i64, got {}",
                 dtype_name(x_BS.dtype()));
  const int64_t B = x_BS.dim(0), S = x_BS.dim(1);
  Tensor y = Tensor::empty({S * B}, DType::I64);
  if (x_BS.dtype() == DType::I32)
    transpose_bs(x_BS.data<int32_t>(), y.data<int64_t>(), B, S);
  else
    transpose_bs(x_BS.data<int64_t>(), y.data<int64_t>(), B, S);
  return y;
}

GPTModel::GPTModel(const GPTConfig& c, ParamRegistry& reg, FfnFactory ffn)
    : cfg_(c),
      chunks_(c.chunks),
      embedding_dropout_("embedding.embedding_dropout", c.hidden_dropout, c.tp),
      recompute_(c.recompute) {
  if (chunks_.empty()) chunks_.push_back({0, c.num_layers, true, true});
  for (const ModelChunk& ch : chunks_) {
    MOE_ASSERT(ch.first_layer >= 0 && ch.num_layers >= 0 && ch.first_layer + ch.num_layers <= c.num_layers);
    has_embedding_ = has_embedding_ || ch.embedding;
    has_loss_ = has_loss_ || ch.loss;
  }
  MOE_ASSERT_MSG(!has_embedding_ || chunks_.front().embedding, "the embedding belongs to the first chunk");
  MOE_ASSERT_MSG(!has_loss_ || chunks_.back().loss, "the loss belongs to the last chunk");
  // Megatron's shared weight: a last stage with a tied output layer holds the word embedding too (same name, so
  // the same initial values; its gradient is summed with the first stage's over the embedding group).
  if (has_embedding_ || (has_loss_ && (!c.untie_embeddings_and_output_weights || c.mtp.num_layers > 0)))
    embedding_ = std::make_unique<Embedding>(reg, "embedding.word_embeddings", c.vocab_size, c.hidden_size,
                                             c.init_method_std, c.tp);
  vocab_start_ = c.tp.rank() * (c.vocab_size / c.tp.size());
  if (has_loss_) {  // under --bf16 it keeps its input (the last layer's output) in bf16 for backward
    NormConfig fn = c.norm();
    fn.low_stash = c.low;
    final_norm_ = std::make_unique<Norm>(reg, "decoder.final_layernorm", c.hidden_size, fn);
  }
  if (has_embedding_ && c.position_embedding == PositionEmbeddingType::LearnedAbsolute)
    position_ = std::make_unique<PositionEmbedding>(reg, "embedding.position_embeddings", c.max_seq_len, c.hidden_size,
                                                    c.init_method_std, c.tp);
  MOE_CHECK(c.num_attention_heads > 0 && c.num_query_groups > 0 && c.num_attention_heads % c.num_query_groups == 0,
            "--num-attention-heads ({}) must be a positive multiple of --num-query-groups ({})", c.num_attention_heads,
            c.num_query_groups);
  const double out_std = c.init_method_std / std::sqrt(2.0 * static_cast<double>(c.num_layers));
  AttentionConfig ac{c.hidden_size,
                     c.num_attention_heads,
                     c.num_query_groups,
                     c.kv_channels,
                     c.max_seq_len,
                     c.rotary_base,
                     c.rotary_percent,
                     c.qk_layernorm,
                     c.norm_eps,
                     c.init_method_std,
                     out_std,
                     c.add_bias_linear,
                     c.low,
                     c.tp,
                     c.attention_dropout,
                     c.normalization,
                     c.zero_centered_gamma,
                     c.position_embedding == PositionEmbeddingType::Rope,
                     c.recompute.core_attn,
                     c.cp};
  for (const ModelChunk& ch : chunks_) {
    chunk_begin_.push_back(layers_.size());
    for (int64_t i = ch.first_layer; i < ch.first_layer + ch.num_layers; i++) {
      const std::string name = "decoder.layers." + std::to_string(i);
      std::unique_ptr<FeedForward> f = ffn ? ffn(reg, name + ".mlp", i) : nullptr;
      if (!f) {
        MLPConfig mc{c.hidden_size,     c.ffn_hidden_size, c.activation, c.add_bias_linear,
                     c.init_method_std, out_std,           c.low,        c.tp,
                     c.recompute.mlp};
        f = std::make_unique<MLP>(reg, name + ".mlp", mc);
      }
      AttentionConfig lac = ac;  // context parallelism: this layer's --cp-comm-type
      lac.cp = c.cp;
      if (!c.cp_comm_types.empty()) lac.cp.comm_type = c.cp_comm_types.at(static_cast<size_t>(i));
      layers_.push_back(std::make_unique<TransformerLayer>(reg, name, lac, c.norm(), std::move(f), c.hidden_dropout,
                                                           c.recompute.layernorm, c.mla));
      global_layer_.push_back(i);
    }
  }
  chunk_begin_.push_back(layers_.size());
  if (!has_loss_) return;
  if (c.mtp.num_layers > 0) {
    std::vector<std::unique_ptr<FeedForward>> mf;
    for (int64_t k = 0; k < c.mtp.num_layers; k++) {
      const std::string name = "mtp.layers." + std::to_string(k) + ".mtp_model_layer.mlp";
      std::unique_ptr<FeedForward> f = ffn ? ffn(reg, name, c.num_layers - 1) : nullptr;
      if (!f)
        f = std::make_unique<MLP>(reg, name,
                                  MLPConfig{c.hidden_size, c.ffn_hidden_size, c.activation, c.add_bias_linear,
                                            c.init_method_std, out_std, c.low, c.tp, c.recompute.mlp});
      mf.push_back(std::move(f));
    }
    mtp_ = std::make_unique<MTPBlock>(reg, c.mtp, c.hidden_size, ac, c.norm(), c.mla, c.hidden_dropout,
                                      c.recompute.layernorm, std::move(mf), c.init_method_std, c.low, c.tp);
    mtp_loss_sums_.assign(static_cast<size_t>(c.mtp.num_layers), 0.0);
  }
  if (c.untie_embeddings_and_output_weights) {
    output_ = std::make_unique<Linear>(reg, "output_layer",
                                       LinearConfig{c.hidden_size, c.vocab_size, false,
                                                    InitRule::normal(c.init_method_std), c.low, TPSplit::Column, c.tp});
  } else {
    output_ = std::make_unique<Linear>(embedding_->weight(), c.low);
  }
}

GPTModel::Stash GPTModel::make_stash() const {
  Stash s;
  for (auto& l : layers_) s.layers.push_back(l->make_stash());
  if (mtp_) s.mtp = mtp_->make_stash();
  return s;
}

void GPTModel::begin_batch(int64_t S, int64_t B, Stash& st) {
  st.S = S;
  st.B = B;
  MOE_CHECK(st.S % cfg_.tp.size() == 0,
            "sequence length {} is not divisible by --tensor-model-parallel-size {} (sequence parallelism)", st.S,
            cfg_.tp.size());
  st.dropout = DropoutBatch{training_, cfg_.seed, st.sample_B, SeqSplit{cfg_.cp.size, cfg_.cp.rank}};
  st.pos.seq = st.dropout.seq;
  if (st.dropout.sample_B.empty())
    for (int64_t b = 0; b < st.B; b++) st.dropout.sample_B.push_back(b);
  MOE_ASSERT_MSG(static_cast<int64_t>(st.dropout.sample_B.size()) == st.B, "{} sample indices for a batch of {}",
                 st.dropout.sample_B.size(), st.B);
}

Tensor GPTModel::forward_chunk(size_t c, const Tensor& in, Stash& st) {
  const ModelChunk& ch = chunks_.at(c);
  const auto shared_bucket = static_cast<size_t>(cfg_.num_layers);  // the embedding's, final norm's, output's
  Tensor h;
  if (!units() && (ch.embedding || ch.loss)) pre_hook(shared_bucket);
  if (ch.embedding) {
    if (units()) pre_hook(shared_bucket);
    MOE_ASSERT(in.ndim() == 2);
    const Tensor tokens = split_sequence_BS(in, SeqSplit{cfg_.cp.size, cfg_.cp.rank});  // CP: this rank's chunks
    begin_batch(tokens.dim(1), tokens.dim(0), st);
    st.tokens_BS = in;  // MTP's inputs: the whole sequence (under CP too)
    const Tensor ids_T = to_sequence_major(tokens).to(embedding_->weight().value.device());
    h = embedding_->forward(ids_T, st.emb).reshape({st.S / cfg_.tp.size(), st.B, cfg_.hidden_size});
    if (position_) position_->forward_(h, st.pos);
    embedding_dropout_.forward_(h, st.dropout);
    probe("embedding", false, h);
    call(unit_hooks_.params_done, shared_bucket);
  } else {
    MOE_ASSERT_MSG(in.ndim() == 3 && in.dim(2) == cfg_.hidden_size, "a chunk's input is [S/TP, B, H], got {}",
                   in.shape().str());
    begin_batch(in.dim(0) * cfg_.tp.size(), in.dim(1), st);
    h = in;
  }
  for (size_t i = chunk_begin_[c]; i < chunk_begin_[c + 1]; i++) {
    pre_hook(static_cast<size_t>(global_layer_[i]));
    if (i + 1 < chunk_begin_[c + 1])  // Megatron FSDP's forward prefetch: the next unit's gather goes out now
      call(unit_hooks_.prefetch, static_cast<size_t>(global_layer_[i + 1]));
    else if (ch.loss)
      call(unit_hooks_.prefetch, shared_bucket);
    st.layers[i].dropout = st.dropout;
    h = recompute_.forward(layers_, st.layers, chunk_begin_[c], chunk_begin_[c + 1], i, h);
    call(unit_hooks_.params_done, static_cast<size_t>(global_layer_[i]));
  }
  if (!ch.loss) return h;
  if (units()) pre_hook(shared_bucket);
  // Without MTP the output layer's GEMM is the norm's only reader: under --bf16 the norm writes bf16 for it.
  h = final_norm_->forward(h, st.final_norm, !mtp_ ? cfg_.low : std::nullopt);
  probe("decoder.final_layernorm", false, h);
  if (mtp_) {
    MOE_ASSERT_MSG(st.tokens_BS.defined() && st.tokens_BS.dim(0) == st.B && st.tokens_BS.dim(1) == st.S * cfg_.cp.size,
                   "MTP needs the micro-batch's input ids on the loss chunk");
    mtp_->forward(h, to_sequence_major(st.tokens_BS), st.S, st.B, *embedding_, *output_, st.dropout, st.mtp);
  }
  // Under --bf16 the output layer writes bf16 logits on the CPU, as Megatron's does; the cross-entropy reads them in
  // f32 (Megatron upcasts them) and overwrites them with their bf16 gradient.
  const Tensor x = sp_all_gather(h, cfg_.tp);
  st.logits_TV = output_->forward(x, st.output, output_->low_output_where_possible(x.device()));
  probe("output_layer", false, st.logits_TV);
  call(unit_hooks_.params_done, shared_bucket);
  return st.logits_TV;
}

Tensor GPTModel::embed_and_decode(const Tensor& tokens_BS, Stash& st) {
  MOE_ASSERT_MSG(chunks_.size() == 1 && has_embedding_ && has_loss_, "the whole model runs on one pipeline stage");
  return forward_chunk(0, tokens_BS, st);
}

double GPTModel::forward(const Tensor& tokens_BS, const Tensor& labels_BS, const Tensor& loss_mask_BS, Stash& st) {
  MOE_ASSERT(labels_BS.shape() == tokens_BS.shape());
  embed_and_decode(tokens_BS, st);
  return loss_forward(labels_BS, loss_mask_BS, st);
}

namespace {
// The upstream gradient of the token losses: the loss mask times token_scale.
Tensor token_dloss(const Tensor& mask_T, double token_scale) {
  Tensor dloss = mask_T.clone();
  kernels::scale_(dloss, token_scale);
  return dloss;
}
}  // namespace

double GPTModel::mtp_backward_scale(double token_scale, double mask_sum) const {
  return token_scale * mask_sum * cfg_.mtp.loss_scaling_factor / static_cast<double>(cfg_.mtp.num_layers);
}

double GPTModel::loss_forward(const Tensor& labels_all, const Tensor& mask_all, Stash& st) {
  MOE_ASSERT(has_loss_ && st.logits_TV.defined());
  const SeqSplit seq{cfg_.cp.size, cfg_.cp.rank};  // CP: this rank's chunks of labels and mask
  const Tensor labels_BS = split_sequence_BS(labels_all, seq), loss_mask_BS = split_sequence_BS(mask_all, seq);
  MOE_ASSERT(labels_BS.ndim() == 2 && labels_BS.dim(0) == st.B && labels_BS.dim(1) == st.S);
  const int64_t T = st.S * st.B;
  const DType dt = kernels::cross_entropy_stats_dtype(st.logits_TV.dtype());
  const Device dev = st.logits_TV.device();  // the batch is built on the host and moves to the model's device
  st.labels_T = to_sequence_major(labels_BS).to(dev);
  const Tensor mask_host_T = mask_sequence_major(loss_mask_BS, labels_BS, dt);
  st.mask_sum = kernels::sum(mask_host_T);  // on the host copy: a GPU run reads nothing back for it
  st.mask_T = mask_host_T.to(dev);
  Tensor loss_T = Tensor::empty({T}, dt, dev);
  st.lse_T = Tensor::empty({T}, dt, dev);
  st.grad_token_scale = -1;
  const auto token_scale_of = std::exchange(st.token_scale_of, nullptr);  // for this forward only
  double mtp_scale = -1;                                                  // MTP's backward scale, when known now
  if (training_ && token_scale_of && !cfg_.tp.on() && kernels::backend_offers(dev).fused_loss_backward) {
    // The gradient backward would start from (backward_chunk), computed with the loss where the backend's one pass
    // does both (kernels/backend.h).
    const double token_scale = token_scale_of(st.mask_sum);
    mtp_scale = mtp_backward_scale(token_scale, st.mask_sum);
    kernels::cross_entropy_forward_backward(st.logits_TV, st.labels_T, token_dloss(st.mask_T, token_scale), loss_T,
                                            st.lse_T);
    st.grad_token_scale = token_scale;
  } else if (cfg_.tp.on()) {
    const comm::ProcessGroup& g = *cfg_.tp.group;
    kernels::cross_entropy_forward_vocab_parallel(
        st.logits_TV, st.labels_T, vocab_start_, cfg_.vocab_size,
        [&g](Tensor& t, bool max) { g.all_reduce(t, max ? comm::ReduceOp::Max : comm::ReduceOp::Sum); }, loss_T,
        st.lse_T);
  } else {
    kernels::cross_entropy_forward(st.logits_TV, st.labels_T, loss_T, st.lse_T);
  }
  if (mtp_) {
    if (seq.on())  // MTP rolls the whole sequence
      mtp_->loss(to_sequence_major(labels_all), mask_sequence_major(mask_all, labels_all, dt), st.mask_sum, st.S, st.B,
                 vocab_start_, cfg_.vocab_size, st.mtp, mtp_scale);
    else
      mtp_->loss(st.labels_T, st.mask_T, st.mask_sum, st.S, st.B, vocab_start_, cfg_.vocab_size, st.mtp, mtp_scale);
    if (training_) {
      for (size_t k = 0; k < mtp_loss_sums_.size(); k++) mtp_loss_sums_[k] += st.mtp.depths[k].loss;
      mtp_micro_batches_++;
    }
  }
  return st.mask_sum > 0 ? kernels::dot(loss_T, st.mask_T) / st.mask_sum : 0.0;
}

void GPTModel::backward(Stash& st, double loss_scale, const std::function<void(size_t)>& grads_final) {
  backward_scaled(st, st.mask_sum > 0 ? loss_scale / st.mask_sum : 0.0, loss_scale, grads_final);
}

void GPTModel::backward_scaled(Stash& st, double token_scale, double aux_scale,
                               const std::function<void(size_t)>& grads_final) {
  MOE_ASSERT_MSG(chunks_.size() == 1 && has_embedding_ && has_loss_, "the whole model runs on one pipeline stage");
  backward_chunk(0, st, Tensor(), token_scale, aux_scale, grads_final);
  if (grads_final) grads_final(static_cast<size_t>(cfg_.num_layers));
}

Tensor GPTModel::backward_chunk(size_t c, Stash& st, const Tensor& dy, double token_scale, double aux_scale,
                                const std::function<void(size_t)>& grads_final) {
  const ModelChunk& ch = chunks_.at(c);
  const int64_t S_local = st.S / cfg_.tp.size();
  const auto shared_bucket = static_cast<size_t>(cfg_.num_layers);
  Tensor dh = dy;
  if (ch.loss) {
    call(unit_hooks_.backward_start, shared_bucket);
    // The logits are not needed after this, so their gradient overwrites them (in bf16 under --bf16 on the CPU,
    // the dtype the output layer's GEMMs read: the same bits as rounding it there), here or in loss_forward.
    Tensor dlogits = st.logits_TV;
    if (st.grad_token_scale >= 0) {
      MOE_ASSERT_MSG(st.grad_token_scale == token_scale,
                     "the logits' gradient was computed with token scale {}, not {}", st.grad_token_scale, token_scale);
    } else {
      kernels::cross_entropy_backward(token_dloss(st.mask_T, token_scale), st.logits_TV, st.labels_T, st.lse_T, dlogits,
                                      vocab_start_);
    }
    st.grad_token_scale = -1;
    st.logits_TV = Tensor();
    probe("cross_entropy", true, dlogits);  // the gradient of the logits
    dh = output_->backward(dlogits, st.output);
    probe("output_layer", true, dh);
    dh = sp_reduce_scatter(dh.reshape({st.S, st.B, cfg_.hidden_size}), cfg_.tp);
    // MTP (Megatron's MTPLossAutoScaler): scale·(factor/D)·d(Σ_k mean_k ce_k), where a mean over this micro-batch's
    // loss tokens has scale token_scale·mask_sum (per-token loss: the rolled mean re-weighted by the main tokens).
    if (mtp_) {
      for (auto& d : st.mtp.depths) d.layer.ffn->loss_scale = aux_scale;
      kernels::add_(dh, mtp_->backward(st.mtp, mtp_backward_scale(token_scale, st.mask_sum), vocab_start_, *embedding_,
                                       *output_));
    }
    dh = final_norm_->backward(dh, st.final_norm);
    probe("decoder.final_layernorm", true, dh);
    // Its gradients are final once the embedding's backward adds to them, where this chunk holds it too.
    if (!ch.embedding) call(grads_written_, shared_bucket);
    call(ch.embedding ? unit_hooks_.params_done : unit_hooks_.backward_done, shared_bucket);
  } else {
    MOE_ASSERT_MSG(dy.defined() && dy.numel() == S_local * st.B * cfg_.hidden_size,
                   "a chunk's output gradient is [S/TP, B, H]");
  }
  for (size_t i = chunk_begin_[c + 1]; i-- > chunk_begin_[c];) {
    st.layers[i].ffn->loss_scale = aux_scale;
    const auto unit = static_cast<size_t>(global_layer_[i]);
    // A full-recompute chunk's replay, each replayed unit gathered for its forward and released after it but for
    // this layer's (Megatron FSDP releases them lazily, as soon as another gather needs the room).
    recompute_.replay(layers_, st.layers, chunk_begin_[c], chunk_begin_[c + 1], i, [&](size_t j, bool before) {
      if (!units()) return;
      const auto u = static_cast<size_t>(global_layer_[j]);
      if (before)
        pre_hook(u);
      else if (j != i)
        call(unit_hooks_.params_done, u);
    });
    if (units()) {
      call(unit_hooks_.backward_start, unit);
      if (i > chunk_begin_[c])  // the backward prefetch: the unit below
        call(unit_hooks_.prefetch, static_cast<size_t>(global_layer_[i - 1]));
      else if (ch.embedding)
        call(unit_hooks_.prefetch, shared_bucket);
    }
    dh = recompute_.backward(layers_, st.layers, chunk_begin_[c], chunk_begin_[c + 1], i, dh);
    call(grads_written_, unit);
    if (grads_final) grads_final(unit);
    call(unit_hooks_.backward_done, unit);
  }
  if (!ch.embedding) return dh;
  call(unit_hooks_.backward_start, shared_bucket);
  dh = embedding_dropout_.backward(dh.reshape({S_local, st.B, cfg_.hidden_size}), st.dropout);
  if (position_) position_->backward(dh.reshape({S_local, st.B, cfg_.hidden_size}), st.pos);
  embedding_->backward(dh.reshape({S_local * st.B, cfg_.hidden_size}), st.emb);
  call(grads_written_, shared_bucket);
  call(unit_hooks_.backward_done, shared_bucket);
  return Tensor();
}

Tensor GPTModel::logits(const Tensor& tokens_BS) {
  Stash st = make_stash();
  set_training(false);
  const int64_t P = cfg_.tp.size(), B = tokens_BS.dim(0), S = tokens_BS.dim(1);
  MOE_CHECK(!cfg_.cp.on(),
            "generation and logits under --context-parallel-size {} are not available: generate from a checkpoint "
            "with --context-parallel-size 1 (checkpoints do not depend on it)",
            cfg_.cp.size);
  if (P == 1) {
    Tensor out = embed_and_decode(tokens_BS, st).to(Device::cpu()).to(DType::F32);  // callers read f32 on the host
    set_training(true);
    return out;
  }
  // Tensor parallel: pad the sequence to a multiple of TP with copies of its last token (causal attention keeps
  // the real positions blind to them), then gather the vocabulary columns of the real rows.
  const int64_t Sp = (S + P - 1) / P * P;
  Tensor padded = Tensor::empty({B, Sp}, DType::I64);
  for (int64_t b = 0; b < B; b++)
    for (int64_t s = 0; s < Sp; s++) padded.set_item(b * Sp + s, tokens_BS.item(b * S + std::min(s, S - 1)));
  const Tensor local = embed_and_decode(padded, st).to(Device::cpu()).to(DType::F32);  // [Sp·B, V/P]
  set_training(true);
  const int64_t VL = local.cols(), rows = S * B;
  Tensor parts = Tensor::empty({P, rows, VL}, local.dtype());
  cfg_.tp.group->all_gather(local.slice(0, rows), parts);
  Tensor out = Tensor::empty({rows, P * VL}, local.dtype());
  const size_t bytes = static_cast<size_t>(VL) * dtype_size(local.dtype());
  for (int64_t r = 0; r < P; r++)
    for (int64_t t = 0; t < rows; t++)
      std::memcpy(static_cast<char*>(out.raw()) + (t * P + r) * bytes,
                  static_cast<const char*>(parts.raw()) + (r * rows + t) * bytes, bytes);
  return out;
}

void GPTModel::set_probe(const Probe* probe) {
  probe_ = probe;
  for (auto& l : layers_) l->set_probe(probe);
}

void GPTModel::set_training(bool training) {
  training_ = training;
  for (auto& l : layers_) l->ffn().set_training(training);
  if (mtp_)
    for (size_t k = 0; k < mtp_->num_layers(); k++) mtp_->layer(k).ffn().set_training(training);
}

void GPTModel::finish_global_batch() {
  for (auto& l : layers_) l->ffn().finish_global_batch();
  if (mtp_)
    for (size_t k = 0; k < mtp_->num_layers(); k++) mtp_->layer(k).ffn().finish_global_batch();
}

std::vector<double> GPTModel::take_mtp_losses() {
  std::vector<double> v = mtp_loss_sums_;
  for (double& x : v) x /= static_cast<double>(std::max<int64_t>(1, mtp_micro_batches_));
  std::fill(mtp_loss_sums_.begin(), mtp_loss_sums_.end(), 0.0);
  mtp_micro_batches_ = 0;
  return v;
}

// What forward_chunk and loss_forward leave in the Stash at a first and a last chunk (stash_bytes.h).
int64_t embedding_stash_bytes(const StashDims& d) {
  return tensor_bytes(d.rows(), DType::I64);
}  // emb.ids_T

int64_t loss_stash_bytes(int64_t hidden, int64_t padded_vocab, NormKind norm, const StashDims& d) {
  const int64_t r = d.rows();
  // The final norm's input (bf16 under --bf16, bf16_stash) and statistics.
  int64_t b = tensor_bytes(d.local_rows() * hidden, d.gemm_input()) + norm_stash_bytes(d.local_rows(), norm);
  b += tensor_bytes(r * hidden, d.gemm_input());             // output.x: the normed output (gathered; bf16 with --bf16)
  b += tensor_bytes(r * (padded_vocab / d.tp), d.logits());  // logits_TV (bf16 with --bf16 on the CPU)
  b += tensor_bytes(r, DType::I64) + 2 * tensor_bytes(r, DType::F32);  // labels_T, mask_T, lse_T
  return b;
}

}  // namespace moecore::nn
