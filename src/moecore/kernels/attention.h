// Causal self-attention with grouped-query heads, computed tile by tile with an online softmax (FlashAttention-2
// style, attention_flash.cpp: every tile product a register-blocked block GEMM, tiles above the diagonal skipped):
// no S×S matrix is ever materialized, forward or backward. Query head h reads key/value head
// h / (Nq/Nkv). Backward recomputes probabilities from the saved log-sum-exp; each output element has one writer and
// a fixed summation order (no atomics), so results are bitwise reproducible whatever the thread count.
#pragma once

#include "moecore/core/tensor.h"
#include "moecore/kernels/dropout.h"

namespace moecore::kernels {

// Attention dropout (Megatron's --attention-dropout on the softmax probabilities, before they weight the values):
// probability (b, h, i, j) is kept or dropped by mask.sub(head_offset + h) at (sample_B[b], seq_offset + i,
// seq_offset + j), so every layout draws the same mask for the same global head and positions. O = (P ⊙ Z)·V with
// Z ∈ {0, 1/(1−p)}; lse stays that of the undropped softmax, Δ_i = Σ_d dO_id·O_id still equals Σ_j P_ij·dP_ij,
// and backward regenerates Z: dV = (P ⊙ Z)ᵀ·dO, dS = P ⊙ (Z ⊙ (dO·Vᵀ) − Δ).
struct AttentionDropout {
  DropoutMask mask;
  const int64_t* sample_B = nullptr;  // global sample index of each sequence of the batch
  int64_t head_offset = 0;            // global index of this call's query head 0 (tensor parallelism)
  int64_t seq_offset = 0;             // global position of query row 0 (context parallelism)
  int64_t key_offset = -1;            // global position of key 0; -1: seq_offset (queries and keys aligned)
  bool on() const { return mask.on(); }
  // Multipliers of keys j0 .. j0+n of query row i (local indices) of head h of sequence b.
  template <typename T>
  void row(int64_t b, int64_t h, int64_t i, int64_t j0, int64_t n, T* z) const {
    dropout_multipliers(mask.sub(static_cast<uint64_t>(head_offset + h)), static_cast<uint64_t>(sample_B[b]),
                        static_cast<uint64_t>(seq_offset + i),
                        static_cast<uint64_t>((key_offset < 0 ? seq_offset : key_offset) + j0), n, z);
  }
  // The mask row() draws query head h's multipliers from, for rows_bits (one derivation per head, not per row).
  DropoutMask head_mask(int64_t h) const { return mask.sub(static_cast<uint64_t>(head_offset + h)); }
  // row()'s multipliers as bits for query rows i .. i + rows − 1, keys j0 .. j0 + n − 1 (n ≤ 64): bit c of bits[r]
  // set where key j0 + c is kept in row i + r (multiplier keep()); head: head_mask(h).
  void rows_bits(const DropoutMask& head, int64_t b, int64_t i, int rows, int64_t j0, int64_t n, uint64_t* bits) const {
    dropout_keep_bits(head, static_cast<uint64_t>(sample_B[b]), static_cast<uint64_t>(seq_offset + i), rows,
                      static_cast<uint64_t>((key_offset < 0 ? seq_offset : key_offset) + j0), n, bits);
  }
  float keep() const { return static_cast<float>(1.0 / (1.0 - mask.p)); }
};

// q_SBND [S, B, Nq, D], k_SBND / v_SBND [S, B, Nkv, D] -> o_SBND [S, B, Nq, D], lse_BNS [B, Nq, S] (kept for
// backward; in units of the scaled scores). scale is usually 1/sqrt(D).
// `dropout` (null or off: none) drops probabilities as AttentionDropout says.
void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, double scale, Tensor& o, Tensor& lse,
                       const AttentionDropout* dropout = nullptr);
// do_SBND -> dq, dk, dv (written). `dropout`: the forward's.
void attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                        const Tensor& lse, double scale, Tensor& dq, Tensor& dk, Tensor& dv,
                        const AttentionDropout* dropout = nullptr);

// The same attention with bf16 GEMM operands, for --bf16 training: q, k, v, dout are f32 and rounded to bf16 where
// they enter a GEMM (q times scale), probabilities and dS are rounded to bf16 for theirs; scores, softmax, lse and
// every output stay f32 — the precision of a bf16 FlashAttention on a GPU. Three kernels, chosen at run time by
// bf16_attention_kernel():
// - FlashNative (CPUs with AVX512-BF16 or AMX; attention_flash_native.cpp): the flash schedule below with its block
//   products on bf16 operands in vdpbf16ps or TDPBF16PS (f32 accumulation), each operand rounded and packed once
//   per call in the pair layout the instructions read (attention_blocks_bf16.h; AMX through a tile policy with a
//   scalar emulation, amx_tiles.h, so its blocking is tested on any CPU). No score block is materialized beyond one
//   tile and no oneDNN call sits in the loop (oneDNN calls per block are what hold OneDnn back). The fastest of the
//   three where it runs (docs/performance.md, bench attention).
// - OneDnn (CPUs where oneDNN has native bf16 matmul but FlashNative does not run; attention_bf16.cpp): query blocks
//   of a chunk of heads go through oneDNN batched bf16 matmuls against their visible keys with an exact (not online)
//   softmax per row: a block holds [rows, visible keys] scores per head, bounded to ~8 MiB of f32 per chunk, never
//   an S×S matrix once S > 128.
// - Flash (other CPUs, where oneDNN would widen bf16 to f32 anyway; attention_flash.cpp): the f32 flash kernel on
//   operands rounded to bf16, probabilities rounded before P·V (they are relative to the running row maximum).
// Sequences longer than kMaxBf16AttentionSeq use the f32 kernel above instead (nn/self_attention.cpp).
//
// FlashNative also reads and writes bf16 tensors (attention_bf16_native_io()): any of q, k, v, dout, o, dq, dk, dv may
// be bf16 (lse stays f32), read as their values and written rounded once, as a bf16 FlashAttention on a GPU keeps its
// inputs and outputs; and it applies RoPE itself when given one (AttentionRope).
struct AttentionRope;
//
// value_dim (0: D): the value heads' width where it is below D (multi-latent attention's 128 of a 192-wide head):
// the caller promises v's (and dout's) channels value_dim..D are zero, so o's and dv's are zero too; a backend may
// skip them (the GPU's cuDNN path runs MLA's 192/128 form), the CPU's kernels compute them as the zeros they are.
void attention_forward_bf16(const Tensor& q, const Tensor& k, const Tensor& v, double scale, Tensor& o, Tensor& lse,
                            const AttentionDropout* dropout = nullptr, const AttentionRope* rope = nullptr,
                            int64_t value_dim = 0);
void attention_backward_bf16(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                             const Tensor& lse, double scale, Tensor& dq, Tensor& dk, Tensor& dv,
                             const AttentionDropout* dropout = nullptr, const AttentionRope* rope = nullptr,
                             int64_t value_dim = 0);
// RoPE applied by the attention kernel as it rounds q and k (rotate-half pairs (i, i + rot_dim/2) of the first rot_dim
// channels, rope.h): q and k come unrotated, row s of a sequence turns by row s of the f32 tables cos_SR, sin_SR
// [≥ S, rot_dim/2], and backward's dq, dk are the gradients of the unrotated q and k. The values are those of
// rope_forward on q and k followed by the kernel, and of rope_backward on its dq, dk (f32 arithmetic, one rounding of
// each operand or output): no separate pass over q, k or their gradients.
struct AttentionRope {
  const Tensor* cos_SR = nullptr;
  const Tensor* sin_SR = nullptr;
  int64_t rot_dim = 0;
};
// Whether this CPU's bf16 kernel is FlashNative, which takes bf16 tensors and an AttentionRope.
bool attention_bf16_native_io();
enum class Bf16AttentionKernel { OneDnn, Flash, FlashNative };
Bf16AttentionKernel bf16_attention_kernel();
// The oneDNN kernel itself, whatever the CPU (bench attention --bf16-kernel onednn compares it).
void attention_forward_bf16_onednn(const Tensor& q, const Tensor& k, const Tensor& v, double scale, Tensor& o,
                                   Tensor& lse, const AttentionDropout* dropout = nullptr);
void attention_backward_bf16_onednn(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                                    const Tensor& o, const Tensor& lse, double scale, Tensor& dq, Tensor& dk,
                                    Tensor& dv, const AttentionDropout* dropout = nullptr);
constexpr int64_t kMaxBf16AttentionSeq = 8192;
// The oneDNN kernel's backward temporaries for its largest block (scores, dP, probabilities, dS, packed operands,
// per-head dK/dV and dQ rows), in bytes: what the memory plan adds to the backward's working set where training
// picks it. `heads`: query heads on this rank; D: the head width the kernel sees.
int64_t attention_backward_bf16_onednn_bytes(int64_t S, int64_t B, int64_t heads, int64_t D);
// The backward temporaries of the bf16 kernel bf16_attention_kernel() picks on this CPU (OneDnn: the above;
// FlashNative: its packed bf16 operands, Δ and dQ accumulator; Flash: Δ, Kᵀ and Vᵀ, its f32 copies of q̂, k and dout
// and the per-thread tiles). `kv_heads`: key/value heads on this rank.
int64_t attention_backward_bf16_bytes(int64_t S, int64_t B, int64_t heads, int64_t kv_heads, int64_t D);

// Blocks of attention at global positions, for context parallelism (nn/context_attention*.cpp; on the CPU
// attention_flash_block.cpp, on the GPU the attention kernels over a span, kernels/cuda/attention_ops.cpp): query
// rows i = 0..Sq-1 sit at global positions q0 + i, keys j = 0..Sk-1 at k0 + j, and key j is visible to row i when k0 +
// j ≤ q0 + i. Tiles wholly masked are skipped, wholly visible ones unmasked. q [Sq, B, Nq, D], k/v [Sk, B, Nkv, D] -> o
// [Sq, B, Nq, D], lse [B, Nq, Sq] of this block alone (a row that sees no key: o 0, lse −inf). `dropout` keys the mask
// by global positions: its seq_offset (and key_offset, when set) are the global positions of the whole sequence's
// position 0, q0 and k0 are added. round_bf16: operands rounded to bf16 as attention_forward_bf16 rounds them (f32
// tensors only): on native bf16 block products where bf16_attention_kernel() is FlashNative
// (attention_flash_native_block.cpp), else on f32 products.
void attention_block_forward(const Tensor& q, const Tensor& k, const Tensor& v, int64_t q0, int64_t k0, double scale,
                             Tensor& o, Tensor& lse, const AttentionDropout* dropout = nullptr,
                             bool round_bf16 = false);
// (o, lse) ← the softmax-weighted merge of (o, lse) and (o_part, lse_part), two partial results of the same query
// rows over disjoint key sets (online softmax across blocks). Deterministic for a fixed merge order.
void attention_merge(Tensor& o, Tensor& lse, const Tensor& o_part, const Tensor& lse_part);
// Backward of one block given the final (merged) o and lse of the rows: dq += this block's term, dk and dv written
// (this block's keys' terms from these rows).
void attention_block_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                              const Tensor& lse, int64_t q0, int64_t k0, double scale, Tensor& dq, Tensor& dk,
                              Tensor& dv, const AttentionDropout* dropout = nullptr, bool round_bf16 = false);

// Tile edge used for queries and keys (rows of a tile).
constexpr int64_t kAttnTile = 64;

// Sizes of one attention call, checked: q [S, B, Nq, D], k and v [S, B, Nkv, D] of one dtype, Nkv dividing Nq.
struct AttentionDims {
  int64_t S, B, Nq, Nkv, D;
  int64_t group() const { return Nq / Nkv; }      // query heads per kv head
  int64_t q_row() const { return B * Nq * D; }    // stride between sequence positions in q/o
  int64_t kv_row() const { return B * Nkv * D; }  // ... in k/v
  int64_t ntiles() const { return (S + kAttnTile - 1) / kAttnTile; }
};
AttentionDims attention_dims(const Tensor& q, const Tensor& k, const Tensor& v);
// The shapes alone (the native kernel's tensors may mix f32 and bf16).
AttentionDims attention_shapes(const Tensor& q, const Tensor& k, const Tensor& v);
// The same, also checking a forward's outputs (o like q, lse [B, Nq, S] of q's dtype) or a backward's operands.
AttentionDims attention_forward_dims(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                                     const Tensor& lse);
AttentionDims attention_backward_dims(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                                      const Tensor& o, const Tensor& lse, const Tensor& dq, const Tensor& dk,
                                      const Tensor& dv);

// The entry points above as one backend implements them (kernels/cpu/attention.cpp, kernels/cuda/attention.cpp),
// each with the signature of the op it is named after; kernels/dispatch.cpp picks the table of the queries' device.
struct AttentionKernels {
  void (*forward)(const Tensor& q, const Tensor& k, const Tensor& v, double scale, Tensor& o, Tensor& lse,
                  const AttentionDropout* dropout);
  void (*backward)(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                   const Tensor& lse, double scale, Tensor& dq, Tensor& dk, Tensor& dv,
                   const AttentionDropout* dropout);
  void (*forward_bf16)(const Tensor& q, const Tensor& k, const Tensor& v, double scale, Tensor& o, Tensor& lse,
                       const AttentionDropout* dropout, const AttentionRope* rope, int64_t value_dim);
  void (*backward_bf16)(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                        const Tensor& lse, double scale, Tensor& dq, Tensor& dk, Tensor& dv,
                        const AttentionDropout* dropout, const AttentionRope* rope, int64_t value_dim);
  void (*block_forward)(const Tensor& q, const Tensor& k, const Tensor& v, int64_t q0, int64_t k0, double scale,
                        Tensor& o, Tensor& lse, const AttentionDropout* dropout, bool round_bf16);
  void (*merge)(Tensor& o, Tensor& lse, const Tensor& o_part, const Tensor& lse_part);
  void (*block_backward)(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                         const Tensor& lse, int64_t q0, int64_t k0, double scale, Tensor& dq, Tensor& dk, Tensor& dv,
                         const AttentionDropout* dropout, bool round_bf16);
};

}  // namespace moecore::kernels
