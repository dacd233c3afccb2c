// Self-attention block: q/k/v projections (grouped-query: Nkv ≤ Nq heads), optional per-head norm of q and k
// (qk-layernorm, RMSNorm or LayerNorm, applied before RoPE as in Megatron), RoPE on a fraction of each head (with
// rope position embeddings only), causal tiled
// attention, output projection. Activations are [S, B, H]. Under tensor parallelism each rank holds Nq/TP query
// heads and Nkv/TP key-value groups (q/k/v column-parallel, the output projection row-parallel) and the block takes
// and returns sequence shards [S/TP, B, H] (see tensor_parallel.h).
#pragma once

#include <string>

#include "moecore/kernels/attention.h"
#include "moecore/kernels/backend.h"
#include "moecore/nn/context_attention.h"
#include "moecore/nn/dropout_sites.h"
#include "moecore/nn/linear.h"
#include "moecore/nn/norm.h"
#include "moecore/nn/tensor_parallel.h"

namespace moecore::nn {

struct AttentionConfig {
  int64_t hidden = 0;
  int64_t num_heads = 0;         // Nq
  int64_t num_query_groups = 0;  // Nkv
  int64_t head_dim = 0;          // D (kv_channels)
  int64_t max_seq_len = 0;
  double rotary_base = 10000.0;
  double rotary_percent = 1.0;
  bool qk_layernorm = false;
  double norm_eps = 1e-5;
  double init_std = 0.02;
  double output_init_std = 0.02;  // init_std / sqrt(2·num_layers) in a model
  bool bias = false;
  LowPrecision low{};  // --bf16 or --fp16: GEMM operands (and attention's q, k, v, o) in that dtype
  TPContext tp;
  double attention_dropout = 0;               // on the softmax probabilities, in training
  NormKind qk_norm_kind = NormKind::RMSNorm;  // Megatron's qk_layernorm uses the configured --normalization
  bool zero_centered_gamma = false;
  bool rope = true;  // false: no rotation (learned_absolute or none position embeddings)
  // --recompute-modules core_attn: the stash keeps q, k, v; the kernel's output and logsumexp (and the output
  // projection's copy of it) are dropped after forward and recomputed at the start of backward.
  bool recompute_core_attn = false;
  // Context parallelism (--context-parallel-size > 1): the block takes this rank's two chunks of each sequence
  // (context_split.h), RoPE turns by their global positions, and the kernel is nn::context_attention_*.
  ContextParallel cp;
};

// Whether attention on the CPU keeps q, k, v and o in bf16 and lets the kernel apply RoPE: --bf16, no context
// parallelism, S within the bf16 kernel's range, and this CPU's bf16 kernel FlashNative (kernels::
// attention_bf16_native_io). S: this rank's sequence length.
bool attention_bf16_tensors(bool bf16, int64_t cp, int64_t S);

class Attention {
 public:
  struct Stash {
    Linear::Stash q, k, v, proj;
    Norm::Stash q_norm, k_norm;
    // The attention kernel's inputs: after the qk-norm, after RoPE unless the kernel applies it (bf16_tensors); kept
    // in bf16 under --bf16. o: between the kernel and the output projection (backward reads the projection's copy).
    Tensor q_SBND, k_SBND, v_SBND;
    Tensor o_SBND, lse_BNS;
    DropoutBatch dropout;  // set by the caller before forward; backward regenerates the same masks
  };

  Attention(ParamRegistry& reg, const std::string& name, const AttentionConfig& cfg);
  // x_SBH [S, B, H] -> [S, B, H]
  Tensor forward(const Tensor& x_SBH, Stash& st);
  Tensor backward(const Tensor& dy_SBH, Stash& st);
  // --recompute-modules layernorm: forget the q/k/v projections' copies of the input x_SBH (the input norm's output),
  // and put them back from the recomputed x_SBH before backward (under SP: all-gathered again).
  void drop_input(Stash& st) const;
  void restore_input(const Tensor& x_SBH, Stash& st) const;
  // The 16-bit dtype forward's input feeds GEMMs in, if it feeds such GEMMs only (the q/k/v projections under --bf16
  // or --fp16): the input norm then writes it so, and the three projections share that one tensor instead of rounding
  // a copy each.
  LowPrecision low_input() const { return cfg_.low; }

 private:
  // The attention kernel (bf16 or f32 by the sequence length): q, k, v -> o, lse.
  void core_forward(Stash& st) const;
  // On a CPU whose bf16 kernel takes bf16 tensors and RoPE (attention_bf16_tensors): the projections write q, k, v
  // in bf16 (f32 with a bias or ahead of the qk-norm), the kernel turns q and k and writes o in bf16, and backward
  // hands it a bf16 dO and takes bf16 dQ, dK, dV back — no cast or RoPE pass between the GEMMs and the kernel.
  bool bf16_tensors(int64_t S, const Device& dev) const {
    return kernels::backend_offers(dev).attention_bf16_tensors &&
           attention_bf16_tensors(cfg_.low == DType::BF16, cfg_.cp.size, S);
  }
  kernels::AttentionRope kernel_rope() const { return {&cos_, &sin_, rot_dim_}; }
  // The dtype the projections write q and k (qk: true) or v in: bf16 with bf16_tensors (no bias; q and k not ahead
  // of the qk-norm, which reads f32), else f32 (the weights' dtype).
  DType operand_dtype(bool b16, bool qk) const {
    return b16 && !cfg_.bias && !(qk && q_norm_) ? DType::BF16 : DType::F32;
  }
  // A stashed kernel operand (bf16 under --bf16) as this rank's kernel reads it: as kept where the kernel takes bf16
  // tensors (bf16_tensors), else widened to f32.
  Tensor kernel_operand(const Tensor& t) const {
    return !is_half(t.dtype()) || bf16_tensors(t.dim(0), t.device()) ? t : t.as_dtype(DType::F32);
  }
  // --bf16 runs attention's GEMMs in bf16 too, up to the sequence length whose score matrices that kernel holds.
  // --fp16 runs the f32 kernel on f16 q, k, v and dO widened (docs/differences.md).
  bool bf16_attention(int64_t S) const { return cfg_.low == DType::BF16 && S <= kernels::kMaxBf16AttentionSeq; }
  // Under context parallelism (S: this rank's rows): bf16 as one rank would run the whole sequence.
  ContextParallel context_parallel(int64_t S) const {
    ContextParallel cp = cfg_.cp;
    cp.bf16 = bf16_attention(S * cp.size);
    return cp;
  }
  // The kernel's dropout for this micro-batch (off outside training or at p = 0).
  kernels::AttentionDropout dropout(const DropoutBatch& d) const;
  // RoPE tables for the L local rows (context parallelism: the rows of this rank's global positions).
  void rope_tables_for(int64_t L, Tensor& cos, Tensor& sin) const;

  AttentionConfig cfg_;
  int64_t nq_, nkv_;  // heads and groups held here
  int64_t rot_dim_;
  Linear q_, k_, v_, proj_;
  std::unique_ptr<Norm> q_norm_, k_norm_;
  Tensor cos_, sin_;
  uint64_t dropout_site_ = 0;
};

}  // namespace moecore::nn
