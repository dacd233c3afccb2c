// Multi-Latent Attention (DeepSeek-V2/V3; Megatron's MLASelfAttention): queries from a low-rank latent
// (x → q_down → norm → q_up, or one direct q projection without --q-lora-rank), keys and values from a shared
// compressed latent (x → kv_down → [c_kv | k_rope]; norm(c_kv) → kv_up → per head [k_nope | v]), RoPE only on the
// decoupled rope channels (the queries' own per head, the key's one part shared by every head), causal attention
// with softmax scale mscale²/sqrt(d_nope + d_rope), output projection. Activations are [S, B, H].
//
// The latent norms exist with --qk-layernorm only, as in Megatron (its spec fuses them into the up projections;
// HF's DeepseekV3 always has them, and Megatron's DeepSeek recipes set --qk-layernorm). They use --normalization.
//
// Tensor parallelism with sequence parallelism: the down projections and latent norms are replicated and run on this
// rank's sequence shard (their gradients are partial per rank and summed over TP like every replicated parameter's,
// parameter.h); the latents are all-gathered along the sequence, the up projections are column-parallel (each rank's
// rows are whole heads: nh = N/TP heads here), the output projection row-parallel and reduce-scattered.
//
// The attention kernel needs one head width for q, k and v: both are padded with zero channels to
// A = max(d_nope + d_rope, d_v) (zero channels add nothing to scores, zero value channels give zero outputs that are
// dropped), so v_head_dim ≠ qk dims costs (A − d_v)/A more value work and nothing else.
#pragma once

#include <algorithm>
#include <memory>
#include <string>

#include "moecore/kernels/backend.h"
#include "moecore/kernels/rope.h"
#include "moecore/nn/self_attention.h"

namespace moecore::nn {

struct MLAConfig {
  bool enabled = false;       // --multi-latent-attention
  int64_t q_lora_rank = 0;    // 0: direct q projection (Megatron's None)
  int64_t kv_lora_rank = 32;  // Megatron's command-line default
  int64_t qk_head_dim = 128, qk_pos_emb_head_dim = 64, v_head_dim = 128;
  bool yarn = true;  // --rope-type yarn (MLA's default); false: plain RoPE
  kernels::YarnParams yarn_params;
  // --recompute-modules mla_up_proj (Megatron's output-discarding checkpoint of qkv_up_proj_and_rope_apply): q, k and
  // v are freed once the attention kernel has run and recomputed from the up projections' stashed inputs (and the
  // rope key) just before its backward.
  bool recompute_up_proj = false;
  // The one head width the attention kernel sees: q, k and v zero-padded to max(qk + rope, v) channels.
  int64_t kernel_head_dim() const { return std::max(qk_head_dim + qk_pos_emb_head_dim, v_head_dim); }
};

class MLAttention {
 public:
  struct Stash {
    Linear::Stash q_down, q_up, kv_down, kv_up, proj;  // q_up: also the direct q projection
    Norm::Stash q_norm, kv_norm;
    // The attention kernel's operands, padded to width A. Kept after forward: q, k, v (bf16 under --bf16; none under
    // mla_up_proj) and lse (f32); o is rebuilt in backward from the output projection's input, its values unpadded.
    Tensor q_SBNA, k_SBNA, v_SBNA, o_SBNA, lse_BNS;
    // mla_up_proj: the gathered rope key before RoPE (bf16 under --bf16; q, k, v are rebuilt from it and the stashes)
    Tensor kpe_SB1R;
    DropoutBatch dropout;  // set by the caller before forward
  };

  // `a` gives hidden, heads, max_seq_len, rotary base and percent, qk_layernorm (the latent norms), norm, init,
  // bias (output projection only, as Megatron), bf16, tp and attention dropout; its kv heads, head dim and rope flag
  // do not apply.
  MLAttention(ParamRegistry& reg, const std::string& name, const AttentionConfig& a, const MLAConfig& m);
  // x_SBH [S/TP, B, H] -> [S/TP, B, H]. With a.recompute_core_attn (--recompute-modules core_attn) the stash keeps
  // q, k, v and backward runs the kernel again for its output and softmax statistics.
  Tensor forward(const Tensor& x_SBH, Stash& st);
  Tensor backward(const Tensor& dy_SBH, Stash& st);
  // Layernorm recompute: drop the stashed copies of the (input norm's) input, and put them back before backward.
  void drop_input(Stash& st) const;
  void restore_input(const Tensor& x_local, Stash& st) const;

  double softmax_scale() const { return scale_; }
  // The 16-bit dtype forward's input feeds GEMMs in, if it feeds such GEMMs only (the down projections, or the q
  // projection, under --bf16 or --fp16): the input norm then writes it so and the projections share that tensor.
  LowPrecision low_input() const { return a_.low; }

 private:
  bool bf16_attention(int64_t S) const { return a_.low == DType::BF16 && S <= kernels::kMaxBf16AttentionSeq; }
  // Context parallelism: the attention of this rank's S rows over the whole sequence (bf16 as a single rank would
  // run it), and the YaRN tables' rows at their global positions (the first S rows without CP).
  ContextParallel context_parallel(int64_t S) const {
    ContextParallel cp = a_.cp;
    cp.bf16 = bf16_attention(S * cp.size);
    return cp;
  }
  void rope_tables_for(int64_t S, Tensor& cos, Tensor& sin) const;
  // The RoPE/YaRN tables follow the model to its device on first use (built on the host at construction).
  void tables_to(Device d);
  kernels::AttentionDropout dropout(const DropoutBatch& d) const;
  // The kernel's operands q, k, v [S, B, nh, A] into st: the up projections' outputs q [S·B, nh·dq] and kv
  // [S·B, nh·(dn + dv)] and the gathered rope key kpe [S, B, 1, dr] (not changed), zero-padded, RoPE applied; rounded
  // to bf16 under --bf16.
  void fill_operands(const Tensor& q, const Tensor& kv, const Tensor& kpe, int64_t S, int64_t B, Stash& st) const;
  // The attention kernel on st's q, k, v into st.o_SBNA and st.lse_BNS; and o without its padding [S·B, nh·dv].
  void core_forward(int64_t S, int64_t B, Stash& st) const;
  Tensor unpadded_output(const Stash& st) const;
  // The inverse, for backward: o [S, B, nh, A] (f32 or f64) from the output projection's input [S·B, nh·dv] (bf16
  // under --bf16, widened), zero in the padding.
  Tensor padded_output(const Tensor& o_unpadded, int64_t S, int64_t B, DType dt) const;
  // A stashed kernel operand as this rank's kernel reads it: as kept where the kernel takes bf16 tensors (the
  // CPU's FlashNative kernel without context parallelism), else widened to f32.
  // What the stash keeps of an operand: bf16 under --bf16.
  Tensor low_operand(const Tensor& t) const { return a_.low ? t.as_dtype(*a_.low) : t; }
  Tensor kernel_operand(const Tensor& t, int64_t S) const {
    const bool reads16 = kernels::backend_offers(t.device()).attention_bf16_tensors &&
                         attention_bf16_tensors(a_.low == DType::BF16, a_.cp.size, S);
    return reads16 || !is_half(t.dtype()) ? t : t.as_dtype(DType::F32);
  }

  AttentionConfig a_;
  MLAConfig m_;
  int64_t nh_;                 // heads held here
  int64_t dn_, dr_, dv_, da_;  // nope, rope, value and padded attention widths
  int64_t rot_;                // rotated channels of the rope part
  double scale_;
  std::unique_ptr<Linear> q_down_, q_up_;  // q_up_: linear_q_up_proj, or linear_q_proj without a q latent
  Linear kv_down_, kv_up_, proj_;
  std::unique_ptr<Norm> q_norm_, kv_norm_;
  Tensor cos_, sin_;
  uint64_t dropout_site_ = 0;
};

}  // namespace moecore::nn
