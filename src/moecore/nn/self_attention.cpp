// Attention module (see attention.h). Backward runs the forward chain in reverse: proj → attention kernel → RoPE
// (inverse rotation) → qk-norm → q/k/v projections, whose input gradients sum into dx.
#include "moecore/nn/self_attention.h"

#include <cmath>
#include <optional>

#include "moecore/core/rng.h"
#include "moecore/core/timers.h"
#include "moecore/kernels/attention.h"
#include "moecore/kernels/elementwise.h"
#include "moecore/kernels/rope.h"
#include "moecore/nn/stash_bytes.h"

namespace moecore::nn {

namespace {
LinearConfig proj_cfg(int64_t in, int64_t out, const AttentionConfig& c, double std, TPSplit split) {
  return LinearConfig{in, out, c.bias, InitRule::normal(std), c.low, split, c.tp};
}
int64_t heads_here(int64_t n, const TPContext& tp, const char* what) {
  MOE_CHECK(n % tp.size() == 0, "{} {} do not split over --tensor-model-parallel-size {}", n, what, tp.size());
  return n / tp.size();
}
}  // namespace

Attention::Attention(ParamRegistry& reg, const std::string& name, const AttentionConfig& cfg)
    : cfg_(cfg),
      nq_(heads_here(cfg.num_heads, cfg.tp, "attention heads")),
      nkv_(heads_here(cfg.num_query_groups, cfg.tp, "query groups (--num-query-groups)")),
      rot_dim_(static_cast<int64_t>(std::llround(cfg.head_dim * cfg.rotary_percent)) / 2 * 2),
      q_(reg, name + ".linear_q",
         proj_cfg(cfg.hidden, cfg.num_heads * cfg.head_dim, cfg, cfg.init_std, TPSplit::Column)),
      k_(reg, name + ".linear_k",
         proj_cfg(cfg.hidden, cfg.num_query_groups * cfg.head_dim, cfg, cfg.init_std, TPSplit::Column)),
      v_(reg, name + ".linear_v",
         proj_cfg(cfg.hidden, cfg.num_query_groups * cfg.head_dim, cfg, cfg.init_std, TPSplit::Column)),
      proj_(reg, name + ".linear_proj",
            proj_cfg(cfg.num_heads * cfg.head_dim, cfg.hidden, cfg, cfg.output_init_std, TPSplit::Row)) {
  MOE_ASSERT(cfg.num_query_groups > 0 && cfg.num_heads % cfg.num_query_groups == 0);
  MOE_ASSERT(!cfg.rope || (rot_dim_ >= 2 && rot_dim_ <= cfg.head_dim));
  if (cfg.qk_layernorm) {
    const NormConfig nc{cfg.qk_norm_kind, cfg.norm_eps, cfg.zero_centered_gamma, /*low_stash=*/cfg.low};
    q_norm_ = std::make_unique<Norm>(reg, name + ".q_layernorm", cfg.head_dim, nc);
    k_norm_ = std::make_unique<Norm>(reg, name + ".k_layernorm", cfg.head_dim, nc);
  }
  if (cfg.rope) kernels::rope_tables(cfg.max_seq_len, rot_dim_, cfg.rotary_base, reg.dtype(), cos_, sin_);
  dropout_site_ = stream_id(name + ".core_attention.attention_dropout");
}

kernels::AttentionDropout Attention::dropout(const DropoutBatch& d) const {
  return attention_dropout(d, dropout_site_, cfg_.attention_dropout, cfg_.tp.rank() * nq_);
}

void Attention::rope_tables_for(int64_t L, Tensor& cos, Tensor& sin) const {
  const SeqSplit seq{cfg_.cp.size, cfg_.cp.rank};
  cos = rows_at_positions(cos_, L, seq);
  sin = rows_at_positions(sin_, L, seq);
}

Tensor Attention::forward(const Tensor& x_local, Stash& st) {
  MOE_ASSERT(x_local.ndim() == 3 && x_local.dim(2) == cfg_.hidden);
  const Tensor x_SBH = sp_all_gather(x_local, cfg_.tp);
  const int64_t S = x_SBH.dim(0), B = x_SBH.dim(1), D = cfg_.head_dim;
  MOE_CHECK(S * cfg_.cp.size <= cfg_.max_seq_len, "sequence length {} exceeds --max-position-embeddings {}",
            S * cfg_.cp.size, cfg_.max_seq_len);
  const bool b16 = bf16_tensors(S, x_SBH.device());
  const DType v_out = operand_dtype(b16, false), qk_out = operand_dtype(b16, true);
  Tensor q = q_.forward(x_SBH, st.q, qk_out).reshape({S, B, nq_, D});
  Tensor k = k_.forward(x_SBH, st.k, qk_out).reshape({S, B, nkv_, D});
  st.v_SBND = v_.forward(x_SBH, st.v, v_out).reshape({S, B, nkv_, D});
  if (q_norm_) {
    q = q_norm_->forward(q, st.q_norm);
    k = k_norm_->forward(k, st.k_norm);
  }
  if (cfg_.rope) {
    if (cos_.device() != q.device()) {  // the tables follow the model to its device on first use
      cos_ = cos_.to(q.device());
      sin_ = sin_.to(q.device());
    }
    Tensor cos = cos_, sin = sin_;
    if (cfg_.cp.on()) rope_tables_for(S, cos, sin);
    if (!b16) {  // in place: the pre-RoPE values are not needed again
      kernels::rope_forward(q, cos, sin, rot_dim_, q);
      kernels::rope_forward(k, cos, sin, rot_dim_, k);
    }
  }
  // Under --bf16 the kernel's operands are bf16, as Megatron's are: rounded here where the projections (with a bias)
  // or the qk-norm wrote f32, so that forward, backward and a core_attn recompute read the same values.
  const auto operand = [&](const Tensor& t) { return cfg_.low ? t.as_dtype(*cfg_.low) : t; };
  st.q_SBND = operand(q);
  st.k_SBND = operand(k);
  st.v_SBND = operand(st.v_SBND);
  core_forward(st);
  Tensor y = proj_.forward(st.o_SBND.reshape({S * B, nq_ * D}), st.proj).reshape({S, B, cfg_.hidden});
  if (cfg_.low) st.o_SBND = Tensor();  // backward reads o as the output projection keeps it (bf16)
  if (cfg_.recompute_core_attn) {
    st.o_SBND = st.lse_BNS = Tensor();
    st.proj = {};
  }
  return sp_reduce_scatter(y, cfg_.tp);
}

void Attention::core_forward(Stash& st) const {
  const int64_t S = st.q_SBND.dim(0), B = st.q_SBND.dim(1);
  // As forward wrote them, or (core_attn recompute) as the stash keeps them.
  const Tensor q = kernel_operand(st.q_SBND), k = kernel_operand(st.k_SBND), v = kernel_operand(st.v_SBND);
  const bool b16 = bf16_tensors(S, q.device());
  st.o_SBND = Tensor::empty(q.shape(), b16 ? DType::BF16 : q.dtype(), q.device());
  st.lse_BNS = Tensor::empty({B, nq_, S}, b16 ? DType::F32 : q.dtype(), q.device());
  const kernels::AttentionRope rope = kernel_rope();
  const kernels::AttentionDropout drop = dropout(st.dropout);
  MOE_ASSERT(!drop.on() || static_cast<int64_t>(st.dropout.sample_B.size()) == B);
  const double scale = 1.0 / std::sqrt(static_cast<double>(cfg_.head_dim));
  TimerScope timer("attention-core", 2);  // moecore's: the attention kernels (bench train's phase table)
  if (cfg_.cp.on())
    context_attention_forward(q, k, v, scale, context_parallel(S), st.o_SBND, st.lse_BNS, &drop);
  else if (bf16_attention(S))
    kernels::attention_forward_bf16(q, k, v, scale, st.o_SBND, st.lse_BNS, &drop, b16 && cfg_.rope ? &rope : nullptr);
  else
    kernels::attention_forward(q, k, v, scale, st.o_SBND, st.lse_BNS, &drop);
}

void Attention::drop_input(Stash& st) const {
  st.q = st.k = st.v = {};
}

void Attention::restore_input(const Tensor& x_local, Stash& st) const {
  const Tensor x_SBH = sp_all_gather(x_local, cfg_.tp);
  q_.stash_input(x_SBH, st.q);
  k_.stash_input(x_SBH, st.k);
  v_.stash_input(x_SBH, st.v);
}

Tensor Attention::backward(const Tensor& dy_local, Stash& st) {
  const Tensor dy_SBH = sp_all_gather(dy_local, cfg_.tp);
  const int64_t S = dy_SBH.dim(0), B = dy_SBH.dim(1), D = cfg_.head_dim;
  if (!st.lse_BNS.defined()) {  // core_attn recompute: the kernel again (same dropout masks), o back into proj
    core_forward(st);
    proj_.stash_input(st.o_SBND.reshape({S * B, nq_ * D}), st.proj);
  }
  // o as the output projection keeps it (bf16 under --bf16), taken before its backward releases it.
  const Tensor o = kernel_operand(st.proj.x.reshape(st.q_SBND.shape()));
  st.o_SBND = Tensor();
  const bool b16 = bf16_tensors(S, dy_SBH.device());
  Tensor d_o = proj_.backward(dy_SBH, st.proj, b16 ? DType::BF16 : DType::F32).reshape(o.shape());
  if (cfg_.low == DType::F16) d_o = d_o.as_dtype(DType::F16).as_dtype(DType::F32);  // dO as an f16 kernel reads it
  // The gradients in the dtypes forward's q, k, v had (bf16 where the projections wrote bf16; else dy's).
  const auto grad_dtype = [&](DType t) { return t == DType::BF16 ? t : dy_SBH.dtype(); };
  const Device dev = dy_SBH.device();
  Tensor dq = Tensor::empty(st.q_SBND.shape(), grad_dtype(operand_dtype(b16, true)), dev);
  Tensor dk = Tensor::empty(st.k_SBND.shape(), grad_dtype(operand_dtype(b16, true)), dev);
  Tensor dv = Tensor::empty(st.v_SBND.shape(), grad_dtype(operand_dtype(b16, false)), dev);
  const Tensor q = kernel_operand(st.q_SBND), k = kernel_operand(st.k_SBND), v = kernel_operand(st.v_SBND);
  const kernels::AttentionDropout drop = dropout(st.dropout);
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  const kernels::AttentionRope rope = kernel_rope();
  std::optional<TimerScope> timer(std::in_place, "attention-core", 2);
  if (cfg_.cp.on())
    context_attention_backward(d_o, q, k, v, o, st.lse_BNS, scale, context_parallel(S), dq, dk, dv, &drop);
  else if (bf16_attention(S))
    kernels::attention_backward_bf16(d_o, q, k, v, o, st.lse_BNS, scale, dq, dk, dv, &drop,
                                     b16 && cfg_.rope ? &rope : nullptr);
  else
    kernels::attention_backward(d_o, q, k, v, o, st.lse_BNS, scale, dq, dk, dv, &drop);
  timer.reset();
  if (cfg_.rope && !b16) {
    Tensor cos = cos_, sin = sin_;
    if (cfg_.cp.on()) rope_tables_for(S, cos, sin);
    kernels::rope_backward(dq, cos, sin, rot_dim_, dq);
    kernels::rope_backward(dk, cos, sin, rot_dim_, dk);
  }
  if (q_norm_) {
    dq = q_norm_->backward(dq, st.q_norm);
    dk = k_norm_->backward(dk, st.k_norm);
  }
  Tensor dx = q_.backward(dq.reshape({S * B, nq_ * D}), st.q);
  k_.backward_add(dk.reshape({S * B, nkv_ * D}), st.k, dx);  // summed by the GEMMs
  v_.backward_add(dv.reshape({S * B, nkv_ * D}), st.v, dx);
  st.q_SBND = st.k_SBND = st.v_SBND = st.o_SBND = st.lse_BNS = Tensor();
  return sp_reduce_scatter(dx.reshape({S, B, cfg_.hidden}), cfg_.tp);
}

bool attention_bf16_tensors(bool bf16, int64_t cp, int64_t S) {
  return bf16 && cp <= 1 && S <= kernels::kMaxBf16AttentionSeq && kernels::attention_bf16_native_io();
}

// What Attention::forward leaves in its Stash (stash_bytes.h).
int64_t attention_stash_bytes(const AttentionConfig& a, const StashDims& d, bool input_dropped) {
  const int64_t r = d.rows(), nq = a.num_heads / d.tp, nkv = a.num_query_groups / d.tp, D = a.head_dim;
  const DType gd = d.gemm_input();  // bf16 under --bf16: every kept activation but the statistics
  int64_t b = 0;
  // st.q/k/v.x: the input norm's output (all-gathered under TP), one tensor the three share (bf16 with --bf16: the
  // norm writes it so, low_input).
  if (!input_dropped) b += tensor_bytes(r * a.hidden, gd);
  // q_SBND, k_SBND, v_SBND; with qk_layernorm also the projections' outputs, kept as the norms' inputs.
  const int64_t norms = a.qk_layernorm ? 2 : 1;
  b += norms * (tensor_bytes(r * nq * D, gd) + tensor_bytes(r * nkv * D, gd));
  if (a.qk_layernorm) b += norm_stash_bytes(r * nq, a.qk_norm_kind) + norm_stash_bytes(r * nkv, a.qk_norm_kind);
  b += tensor_bytes(r * nkv * D, gd);
  if (!a.recompute_core_attn)  // o as the output projection keeps it (its input: o itself or its bf16 copy), lse_BNS
    b += tensor_bytes(r * nq * D, gd) + tensor_bytes(r * nq, DType::F32);
  return b;
}

// What Attention::backward builds beside its stash for the kernel (stash_bytes.h): under --bf16 where the kernel
// takes only f32 tensors (on the CPU, as the plan is), q, k, v and o widened.
int64_t attention_backward_rebuilt_bytes(const AttentionConfig& a, const StashDims& d) {
  if (!d.low || (!d.gpu && attention_bf16_tensors(d.low == DType::BF16, d.cp, d.S))) return 0;
  const int64_t r = d.rows(), nq = a.num_heads / d.tp, nkv = a.num_query_groups / d.tp, D = a.head_dim;
  return 2 * tensor_bytes(r * nq * D, DType::F32) + 2 * tensor_bytes(r * nkv * D, DType::F32);
}

}  // namespace moecore::nn
