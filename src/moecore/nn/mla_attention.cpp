// Multi-Latent Attention (see mla_attention.h). Backward runs the chain in reverse: output projection → attention
// kernel → RoPE (the transposed map) → the heads' q and [k_nope | v] slices back to the up projections' outputs →
// the shared rope key's gradient summed over heads → all-gathers' adjoints (reduce-scatters) → latent norms → down
// projections, whose input gradients sum into dx.
#include "moecore/nn/mla_attention.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "moecore/core/rng.h"
#include "moecore/core/timers.h"
#include "moecore/kernels/elementwise.h"
#include "moecore/kernels/mla_blocks.h"
#include "moecore/nn/context_split.h"
#include "moecore/nn/stash_bytes.h"

namespace moecore::nn {

namespace {

LinearConfig lin(int64_t in, int64_t out, bool bias, double std, const AttentionConfig& a, TPSplit split) {
  return LinearConfig{in, out, bias, InitRule::normal(std), a.low, split, a.tp};
}

int64_t heads_here(const AttentionConfig& a) {
  MOE_CHECK(a.num_heads % a.tp.size() == 0, "{} attention heads do not split over --tensor-model-parallel-size {}",
            a.num_heads, a.tp.size());
  return a.num_heads / a.tp.size();
}

}  // namespace

MLAttention::MLAttention(ParamRegistry& reg, const std::string& name, const AttentionConfig& a, const MLAConfig& m)
    : a_(a),
      m_(m),
      nh_(heads_here(a)),
      dn_(m.qk_head_dim),
      dr_(m.qk_pos_emb_head_dim),
      dv_(m.v_head_dim),
      da_(m.kernel_head_dim()),
      kv_down_(reg, name + ".linear_kv_down_proj",
               lin(a.hidden, m.kv_lora_rank + m.qk_pos_emb_head_dim, false, a.init_std, a, TPSplit::None)),
      kv_up_(reg, name + ".linear_kv_up_proj",
             lin(m.kv_lora_rank, a.num_heads * (m.qk_head_dim + m.v_head_dim), false, a.init_std, a, TPSplit::Column)),
      proj_(reg, name + ".linear_proj",
            lin(a.num_heads * m.v_head_dim, a.hidden, a.bias, a.output_init_std, a, TPSplit::Row)) {
  MOE_ASSERT(m.kv_lora_rank > 0 && m.qk_head_dim >= 0 && m.qk_pos_emb_head_dim >= 2 && m.v_head_dim > 0);
  const int64_t dq = dn_ + dr_;
  if (m.q_lora_rank > 0) {
    q_down_ = std::make_unique<Linear>(reg, name + ".linear_q_down_proj",
                                       lin(a.hidden, m.q_lora_rank, false, a.init_std, a, TPSplit::None));
    q_up_ = std::make_unique<Linear>(reg, name + ".linear_q_up_proj",
                                     lin(m.q_lora_rank, a.num_heads * dq, false, a.init_std, a, TPSplit::Column));
  } else {
    q_up_ = std::make_unique<Linear>(reg, name + ".linear_q_proj",
                                     lin(a.hidden, a.num_heads * dq, false, a.init_std, a, TPSplit::Column));
  }
  if (a.qk_layernorm) {
    const NormConfig nc{a.qk_norm_kind, a.norm_eps, a.zero_centered_gamma, /*low_stash=*/a.low};
    if (q_down_) q_norm_ = std::make_unique<Norm>(reg, name + ".q_layernorm", m.q_lora_rank, nc);
    kv_norm_ = std::make_unique<Norm>(reg, name + ".kv_layernorm", m.kv_lora_rank, nc);
  }
  // Megatron: plain RoPE rotates int(d_rope · rotary_percent) channels; YaRN always all of them (rotary_percent
  // does not reach it). The softmax scale carries YaRN's mscale(s, mscale_all_dim)² whatever the rope type.
  std::vector<double> inv_freq;
  double amplitude = 1.0;
  if (m.yarn) {
    rot_ = dr_;
    inv_freq = kernels::yarn_inv_freq(rot_, a.rotary_base, m.yarn_params);
    amplitude = kernels::yarn_concentration_factor(m.yarn_params);
  } else {
    rot_ = static_cast<int64_t>(static_cast<double>(dr_) * a.rotary_percent);
    MOE_CHECK(rot_ >= 2 && rot_ % 2 == 0,
              "--qk-pos-emb-head-dim {} x --rotary-percent {} must rotate an even number (at least 2) of channels", dr_,
              a.rotary_percent);
    inv_freq = kernels::rope_inv_freq(rot_, a.rotary_base);
  }
  kernels::rope_tables_from(a.max_seq_len, inv_freq, amplitude, reg.dtype(), cos_, sin_);
  const double ms = kernels::yarn_get_mscale(m.yarn_params.scaling_factor, m.yarn_params.mscale_all_dim);
  scale_ = ms * ms / std::sqrt(static_cast<double>(dq));
  dropout_site_ = stream_id(name + ".core_attention.attention_dropout");
}

kernels::AttentionDropout MLAttention::dropout(const DropoutBatch& d) const {
  return attention_dropout(d, dropout_site_, a_.attention_dropout, a_.tp.rank() * nh_);
}

void MLAttention::rope_tables_for(int64_t S, Tensor& cos, Tensor& sin) const {
  const SeqSplit seq{a_.cp.size, a_.cp.rank};
  cos = seq.on() ? rows_at_positions(cos_, S, seq) : cos_;
  sin = seq.on() ? rows_at_positions(sin_, S, seq) : sin_;
}

void MLAttention::tables_to(Device d) {
  if (cos_.device() == d) return;
  cos_ = cos_.to(d);
  sin_ = sin_.to(d);
}

Tensor MLAttention::forward(const Tensor& x_local, Stash& st) {
  MOE_ASSERT(x_local.ndim() == 3 && x_local.dim(2) == a_.hidden);
  const int64_t Sl = x_local.dim(0), B = x_local.dim(1), S = Sl * a_.tp.size();
  MOE_CHECK(S * a_.cp.size <= a_.max_seq_len, "sequence length {} exceeds --max-position-embeddings {}", S * a_.cp.size,
            a_.max_seq_len);
  const Device dev = x_local.device();
  tables_to(dev);
  // Queries: [S·B, nh·dq].
  Tensor q;
  if (q_down_) {
    Tensor cq = q_down_->forward(x_local, st.q_down);
    if (q_norm_) cq = q_norm_->forward(cq, st.q_norm);
    q = q_up_->forward(sp_all_gather(cq.reshape({Sl, B, m_.q_lora_rank}), a_.tp), st.q_up);
  } else {
    q = q_up_->forward(sp_all_gather(x_local, a_.tp), st.q_up);
  }
  // Compressed kv and the shared rope key, on this rank's shard, then gathered.
  const int64_t R = m_.kv_lora_rank, W = R + dr_;
  const Tensor kvc = kv_down_.forward(x_local, st.kv_down);  // [Sl·B, R + dr]
  // The projections' outputs' dtype (x_local is bf16 under --bf16).
  const DType dt = kvc.dtype();
  Tensor ckv = Tensor::empty({Sl, B, R}, dt, dev), kpe = Tensor::empty({S, B, 1, dr_}, dt, dev);
  Tensor kpe_local = Tensor::empty({Sl, B, dr_}, dt, dev);
  kernels::mla_move_block(kvc, 1, W, 0, ckv, 1, R, 0, R, Sl * B);
  kernels::mla_move_block(kvc, 1, W, R, kpe_local, 1, dr_, 0, dr_, Sl * B);
  if (kv_norm_) ckv = kv_norm_->forward(ckv, st.kv_norm);
  kpe.copy_from(sp_all_gather(kpe_local, a_.tp));
  const Tensor kv = kv_up_.forward(sp_all_gather(ckv, a_.tp), st.kv_up);  // [S·B, nh·(dn + dv)]
  // Under --bf16 the rope key and the kernel's operands are bf16, as Megatron keeps them: rounded once here, so that
  // forward, backward and the recomputes (mla_up_proj, core_attn) read the same values.
  if (a_.low) kpe = kpe.as_dtype(*a_.low).as_dtype(dt);
  fill_operands(q, kv, kpe, S, B, st);
  if (m_.recompute_up_proj) st.kpe_SB1R = low_operand(kpe);
  core_forward(S, B, st);
  if (m_.recompute_up_proj) st.q_SBNA = st.k_SBNA = st.v_SBNA = Tensor();  // rebuilt before the kernel's backward
  const Tensor y = proj_.forward(unpadded_output(st), st.proj).reshape({S, B, a_.hidden});
  // o's values are the output projection's input (bf16 under --bf16): backward pads them again.
  st.o_SBNA = Tensor();
  if (a_.recompute_core_attn) {  // the kernel runs again in backward
    st.lse_BNS = Tensor();
    st.proj = {};
  }
  return sp_reduce_scatter(y, a_.tp);
}

void MLAttention::core_forward(int64_t S, int64_t B, Stash& st) const {
  // q, k, v as fill_operands wrote them, or (core_attn recompute) as the stash keeps them.
  const Tensor q = kernel_operand(st.q_SBNA, S), k = kernel_operand(st.k_SBNA, S), v = kernel_operand(st.v_SBNA, S);
  const DType dt = is_half(st.q_SBNA.dtype()) ? DType::F32 : st.q_SBNA.dtype();
  const Device dev = st.q_SBNA.device();
  st.o_SBNA = Tensor::empty({S, B, nh_, da_}, dt, dev);
  st.lse_BNS = Tensor::empty({B, nh_, S}, dt, dev);
  const kernels::AttentionDropout drop = dropout(st.dropout);
  MOE_ASSERT(!drop.on() || static_cast<int64_t>(st.dropout.sample_B.size()) == B);
  const TimerScope timer("attention-core", 2);
  if (a_.cp.on())
    context_attention_forward(q, k, v, scale_, context_parallel(S), st.o_SBNA, st.lse_BNS, &drop);
  else if (bf16_attention(S))
    kernels::attention_forward_bf16(q, k, v, scale_, st.o_SBNA, st.lse_BNS, &drop, nullptr, dv_);  // v: dv_ wide
  else
    kernels::attention_forward(q, k, v, scale_, st.o_SBNA, st.lse_BNS, &drop);
}

Tensor MLAttention::unpadded_output(const Stash& st) const {
  const int64_t T = st.o_SBNA.dim(0) * st.o_SBNA.dim(1);
  Tensor o = Tensor::empty({T, nh_ * dv_}, st.o_SBNA.dtype(), st.o_SBNA.device());
  kernels::mla_move_block(st.o_SBNA, nh_, da_, 0, o, nh_, dv_, 0, dv_, T);
  return o;
}

Tensor MLAttention::padded_output(const Tensor& o_unpadded, int64_t S, int64_t B, DType dt) const {
  const int64_t T = S * B;
  MOE_ASSERT(o_unpadded.rows() == T && o_unpadded.cols() == nh_ * dv_);
  Tensor o = Tensor::zeros({S, B, nh_, da_}, dt, o_unpadded.device());
  kernels::mla_move_block(o_unpadded.as_dtype(dt), nh_, dv_, 0, o, nh_, da_, 0, dv_, T);
  return o;
}

void MLAttention::drop_input(Stash& st) const {
  st.kv_down = {};
  if (q_down_)
    st.q_down = {};
  else
    st.q_up = {};
}

void MLAttention::restore_input(const Tensor& x_local, Stash& st) const {
  kv_down_.stash_input(x_local, st.kv_down);
  if (q_down_)
    q_down_->stash_input(x_local, st.q_down);
  else
    q_up_->stash_input(sp_all_gather(x_local, a_.tp), st.q_up);
}

void MLAttention::fill_operands(const Tensor& q, const Tensor& kv, const Tensor& kpe, int64_t S, int64_t B,
                                Stash& st) const {
  const int64_t T = S * B, dq = dn_ + dr_;
  const DType dt = q.dtype();
  const Device dev = q.device();
  st.q_SBNA = Tensor::zeros({S, B, nh_, da_}, dt, dev);
  st.k_SBNA = Tensor::zeros({S, B, nh_, da_}, dt, dev);
  st.v_SBNA = Tensor::zeros({S, B, nh_, da_}, dt, dev);
  kernels::mla_move_block(q, nh_, dq, 0, st.q_SBNA, nh_, da_, 0, dq, T);
  Tensor cos, sin;
  rope_tables_for(S, cos, sin);
  kernels::rope_forward_at(st.q_SBNA, cos, sin, dn_, rot_, kernels::RopePairs::Interleaved, st.q_SBNA);
  Tensor kpe_rot = kpe.clone();
  kernels::rope_forward_at(kpe_rot, cos, sin, 0, rot_, kernels::RopePairs::Interleaved, kpe_rot);
  kernels::mla_move_block(kv, nh_, dn_ + dv_, 0, st.k_SBNA, nh_, da_, 0, dn_, T);
  kernels::mla_move_block(kpe_rot, 1, dr_, 0, st.k_SBNA, nh_, da_, dn_, dr_, T);
  kernels::mla_move_block(kv, nh_, dn_ + dv_, dn_, st.v_SBNA, nh_, da_, 0, dv_, T);
  st.q_SBNA = low_operand(st.q_SBNA);
  st.k_SBNA = low_operand(st.k_SBNA);
  st.v_SBNA = low_operand(st.v_SBNA);
}

Tensor MLAttention::backward(const Tensor& dy_local, Stash& st) {
  const Tensor dy_SBH = sp_all_gather(dy_local, a_.tp);
  const int64_t S = dy_SBH.dim(0), B = dy_SBH.dim(1), Sl = dy_local.dim(0), T = S * B, dq = dn_ + dr_;
  const DType dt = dy_SBH.dtype();
  const Device dev = dy_SBH.device();
  tables_to(dev);
  if (m_.recompute_up_proj) {  // mla_up_proj: the up projections and RoPE again, from their stashed inputs
    const Tensor q_in = st.q_up.x, kv_in = st.kv_up.x;
    fill_operands(q_up_->forward(q_in, st.q_up), kv_up_.forward(kv_in, st.kv_up), st.kpe_SB1R.as_dtype(dt), S, B, st);
    st.kpe_SB1R = Tensor();
  }
  if (!st.lse_BNS.defined()) {  // core_attn recompute: the kernel again (same dropout masks), o back into proj
    core_forward(S, B, st);
    proj_.stash_input(unpadded_output(st), st.proj);
  }
  // o from the output projection's input (bf16 under --bf16), before its backward releases it.
  st.o_SBNA = padded_output(st.proj.x, S, B, dt);
  const Tensor d_o = proj_.backward(dy_SBH, st.proj);  // [T, nh·dv]
  Tensor dO = Tensor::zeros({S, B, nh_, da_}, dt, dev);
  kernels::mla_move_block(d_o, nh_, dv_, 0, dO, nh_, da_, 0, dv_, T);
  Tensor dQ = Tensor::empty(st.q_SBNA.shape(), dt, dev), dK = Tensor::empty(st.k_SBNA.shape(), dt, dev);
  Tensor dV = Tensor::empty(st.v_SBNA.shape(), dt, dev);
  const kernels::AttentionDropout drop = dropout(st.dropout);
  std::optional<TimerScope> timer(std::in_place, "attention-core", 2);
  const Tensor q = kernel_operand(st.q_SBNA, S), k = kernel_operand(st.k_SBNA, S), v = kernel_operand(st.v_SBNA, S);
  if (a_.cp.on())
    context_attention_backward(dO, q, k, v, st.o_SBNA, st.lse_BNS, scale_, context_parallel(S), dQ, dK, dV, &drop);
  else if (bf16_attention(S))
    kernels::attention_backward_bf16(dO, q, k, v, st.o_SBNA, st.lse_BNS, scale_, dQ, dK, dV, &drop, nullptr, dv_);
  else
    kernels::attention_backward(dO, q, k, v, st.o_SBNA, st.lse_BNS, scale_, dQ, dK, dV, &drop);
  timer.reset();
  st.q_SBNA = st.k_SBNA = st.v_SBNA = st.o_SBNA = st.lse_BNS = Tensor();
  // Queries: undo RoPE, take each head's dq channels.
  Tensor cos, sin;
  rope_tables_for(S, cos, sin);
  kernels::rope_backward_at(dQ, cos, sin, dn_, rot_, kernels::RopePairs::Interleaved, dQ);
  Tensor d_q = Tensor::empty({T, nh_ * dq}, dt, dev);
  kernels::mla_move_block(dQ, nh_, da_, 0, d_q, nh_, dq, 0, dq, T);
  // Keys and values back to kv_up's output layout [k_nope | v] per head; the shared rope key sums its heads.
  Tensor d_kv = Tensor::empty({T, nh_ * (dn_ + dv_)}, dt, dev);
  kernels::mla_move_block(dK, nh_, da_, 0, d_kv, nh_, dn_ + dv_, 0, dn_, T);
  kernels::mla_move_block(dV, nh_, da_, 0, d_kv, nh_, dn_ + dv_, dn_, dv_, T);
  Tensor d_kpe = Tensor::empty({S, B, 1, dr_}, dt, dev);
  kernels::mla_move_block(dK, nh_, da_, dn_, d_kpe, 1, dr_, 0, dr_, T);
  kernels::rope_backward_at(d_kpe, cos, sin, 0, rot_, kernels::RopePairs::Interleaved, d_kpe);
  // Each rank's heads give part of the latents' gradients: reduce-scatter is the all-gather's adjoint.
  const int64_t R = m_.kv_lora_rank, W = R + dr_;
  Tensor d_ckv = sp_reduce_scatter(kv_up_.backward(d_kv, st.kv_up).reshape({S, B, R}), a_.tp);
  if (kv_norm_) d_ckv = kv_norm_->backward(d_ckv, st.kv_norm);
  const Tensor d_kpe_local = sp_reduce_scatter(d_kpe.reshape({S, B, dr_}), a_.tp);
  Tensor d_kvc = Tensor::empty({Sl * B, W}, dt, dev);
  kernels::mla_move_block(d_ckv, 1, R, 0, d_kvc, 1, W, 0, R, Sl * B);
  kernels::mla_move_block(d_kpe_local, 1, dr_, 0, d_kvc, 1, W, R, dr_, Sl * B);
  Tensor dx = kv_down_.backward(d_kvc, st.kv_down);  // [Sl·B, H]
  if (q_down_) {
    Tensor d_cq = sp_reduce_scatter(q_up_->backward(d_q, st.q_up).reshape({S, B, m_.q_lora_rank}), a_.tp);
    if (q_norm_) d_cq = q_norm_->backward(d_cq, st.q_norm);
    q_down_->backward_add(d_cq.reshape({Sl * B, m_.q_lora_rank}), st.q_down, dx);  // summed by the GEMM
  } else {
    kernels::add_(dx, sp_reduce_scatter(q_up_->backward(d_q, st.q_up).reshape({S, B, a_.hidden}), a_.tp)
                          .reshape({Sl * B, a_.hidden}));
  }
  return dx.reshape({Sl, B, a_.hidden});
}

// What MLAttention::forward leaves in its Stash (stash_bytes.h).
int64_t mla_stash_bytes(const AttentionConfig& a, const MLAConfig& m, const StashDims& d, bool input_dropped) {
  const int64_t r = d.rows(), rl = d.local_rows(), H = a.hidden, nh = a.num_heads / d.tp;
  const int64_t da = m.kernel_head_dim(), R = m.kv_lora_rank;
  const auto f32 = [](int64_t n) { return tensor_bytes(n, DType::F32); };
  const DType gd = d.gemm_input();  // bf16 under --bf16: every kept activation but the statistics
  // The layer's normed input x_local: the down projections' (or the q projection's) input, one tensor they share
  // (the input norm writes it in bf16 under --bf16); none when layernorm recompute drops it.
  int64_t b = input_dropped ? 0 : tensor_bytes(rl * H, gd);
  if (m.q_lora_rank > 0) {
    const int64_t Q = m.q_lora_rank;
    if (a.qk_layernorm) b += tensor_bytes(rl * Q, gd) + norm_stash_bytes(rl, a.qk_norm_kind);  // q_norm's input
    b += tensor_bytes(r * Q, gd);  // q_up's input (gathered)
  } else if (!input_dropped && d.tp > 1) {
    b += tensor_bytes(r * H, gd);  // linear_q_proj's input: the gathered x
  }
  // kv_norm's input and statistics; kv_up's input (gathered).
  if (a.qk_layernorm) b += tensor_bytes(rl * R, gd) + norm_stash_bytes(rl, a.qk_norm_kind);
  b += tensor_bytes(r * R, gd);
  // q, k, v padded to width A (mla_up_proj: the rope key before RoPE instead); lse and proj's input, o's values
  // unpadded (core_attn: none).
  b += m.recompute_up_proj ? tensor_bytes(r * m.qk_pos_emb_head_dim, gd) : 3 * tensor_bytes(r * nh * da, gd);
  if (!a.recompute_core_attn) b += f32(r * nh) + tensor_bytes(r * nh * m.v_head_dim, gd);
  return b;
}

// What MLAttention::backward builds beside its stash before the kernel's backward (stash_bytes.h).
int64_t mla_backward_rebuilt_bytes(const AttentionConfig& a, const MLAConfig& m, const StashDims& d) {
  const int64_t r = d.rows(), nh = a.num_heads / d.tp, da = m.kernel_head_dim();
  const int64_t padded = tensor_bytes(r * nh * da, DType::F32);
  // o padded again (f32; or by a core_attn recompute), and under bf16 proj's input widened for it.
  int64_t b = padded;
  if (d.low) b += tensor_bytes(r * nh * m.v_head_dim, DType::F32);
  // q, k, v widened where the kernel takes only f32 tensors (the plan is made for this CPU).
  if (d.low && (d.gpu || !attention_bf16_tensors(d.low == DType::BF16, d.cp, d.S))) b += 3 * padded;
  return b;
}

}  // namespace moecore::nn
