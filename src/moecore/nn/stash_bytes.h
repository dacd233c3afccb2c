// The bytes a module's stash holds per micro-batch after its forward (DESIGN contract 1), from the module's
// configuration and the micro-batch's shape alone, so a memory plan can be made before anything is built, for any
// size. Each function is defined next to its module's forward (attention.cpp, mlp.cpp, router.cpp, ...) and counts
// exactly the tensors that forward leaves in the stash, in the allocator's size classes (core/allocator.h), under
// the configured recompute, tensor/sequence parallelism and bf16; tests/train/test_memory_plan_measured.cpp
// checks them against the allocator's live bytes after a real forward.
//
// Ownership, so that a tensor two stashes share is counted once: a module counts the tensors it creates and keeps,
// and the input it keeps itself (the layer's input is counted by the layer's input norm, a norm output by the
// module that consumes it: attention, the MLP, the MoE layer). Under --bf16 a Linear keeps its own bf16 copy of
// its input; in f32 it shares its caller's tensor.
#pragma once

#include <cstdint>

#include "moecore/core/dtype.h"

namespace moecore::nn {

// One micro-batch on one rank.
struct StashDims {
  int64_t S = 0;       // sequence length this rank's layers see: --seq-length / CP (context parallelism's seam)
  int64_t B = 0;       // --micro-batch-size
  int64_t tp = 1;      // tensor parallel size: between blocks, sequence shards of S/tp rows (sequence parallelism)
  int64_t cp = 1;      // context parallel size
  LowPrecision low{};  // --bf16 or --fp16
  bool training = true;
  // Planned for a GPU (moecore plan --device cuda on any machine): its attention kernels read f32 tensors and its
  // output layer writes f32 logits, where this CPU's kernels may take bf16 ones.
  bool gpu = false;
  int64_t rows() const { return S * B; }             // tokens after the sequence all-gather
  int64_t local_rows() const { return S / tp * B; }  // tokens of a sequence shard
  DType gemm_input() const { return low.value_or(DType::F32); }
  DType logits() const { return low && !gpu ? *low : DType::F32; }  // the output layer's (GPTModel)
};

// A tensor of `numel` elements of `dt` as the allocator holds it (rounded to its size class); 0 for none.
int64_t tensor_bytes(int64_t numel, DType dt);

struct AttentionConfig;
struct MLAConfig;
struct MLPConfig;
enum class NormKind;

// Linear: what it keeps beyond its caller's tensor (the bf16 copy of its [rows, in] input; nothing in f32).
int64_t linear_stash_bytes(int64_t rows, int64_t in, LowPrecision low);
// Norm over [rows, dim]: its statistics (mean and rstd for LayerNorm, rstd for RMSNorm); its input is its
// caller's.
int64_t norm_stash_bytes(int64_t rows, NormKind kind);
// Attention (GQA) and MLA: the input norm's output as kept (gathered under TP), q/k/v, the kernel's output and
// statistics; core_attn recompute drops the last two; drop_input (layernorm recompute) the first.
int64_t attention_stash_bytes(const AttentionConfig& a, const StashDims& d, bool input_dropped);
int64_t mla_stash_bytes(const AttentionConfig& a, const MLAConfig& m, const StashDims& d, bool input_dropped);
// What attention's backward builds beside its stash for the kernel: under --bf16, where the kernel takes only f32
// tensors, q, k, v and o widened.
int64_t attention_backward_rebuilt_bytes(const AttentionConfig& a, const StashDims& d);
// What MLA's backward builds beside its stash before the kernel's backward: o padded again from the output
// projection's input, and under --bf16 the operands widened where the kernel reads f32 only.
int64_t mla_backward_rebuilt_bytes(const AttentionConfig& a, const MLAConfig& m, const StashDims& d);
// MLP: the pre-MLP norm's output as kept, fc1's output, the activation (fc2's input).
int64_t mlp_stash_bytes(const MLPConfig& m, const StashDims& d, bool input_dropped, bool input_shared = false);
// TransformerLayer: its input and the attention block's output (the two norms' inputs), both norms' statistics,
// and the attention's stash; ffn_bytes: the FFN's (counted with input_dropped = recompute_norms).
int64_t layer_stash_bytes(const AttentionConfig& a, const MLAConfig& m, NormKind norm, bool recompute_norms,
                          int64_t ffn_bytes, const StashDims& d);
// Full recompute: a released layer keeps its chunk's input when it begins the chunk, else nothing.
int64_t released_layer_stash_bytes(int64_t hidden, bool chunk_begin, const StashDims& d);
// GPTModel chunks: the embedding's token ids (a first chunk); the final norm, the output layer's input, the
// logits [S·B, V/TP], labels, loss mask and logsumexp (a last chunk).
int64_t embedding_stash_bytes(const StashDims& d);
int64_t loss_stash_bytes(int64_t hidden, int64_t padded_vocab, NormKind norm, const StashDims& d);
// One multi-token-prediction depth (nn/mtp.h) with `layer` its transformer layer's stash: the embedding lookup, the
// enorm/hnorm inputs and eh_proj's (only the two inputs under recompute), the final norm, the output layer's input,
// its logits and loss statistics.
int64_t mtp_depth_stash_bytes(int64_t hidden, int64_t padded_vocab, NormKind norm, const StashDims& d, bool recompute,
                              int64_t layer);

}  // namespace moecore::nn

namespace moecore::moe {

struct RouterConfig;
struct ExpertsConfig;
struct MoELayerConfig;

// Router over T tokens: the gating input when it is not the caller's (router dtype, jitter; under bf16 the MoE
// layer's bf16 tokens unless jittered), logits, top-K ids, probabilities and masks, scores, the aux losses' scores
// and gradients, the z-loss logsumexp (all in the router dtype, f32 or f64, whatever bf16).
int64_t router_stash_bytes(const RouterConfig& r, int64_t T, bool training, LowPrecision low = std::nullopt);
// The dispatcher's plan for T tokens, `rows` permuted here and `received` after the exchange (ep: under EP).
int64_t dispatch_plan_bytes(int64_t T, int64_t rows, int64_t received, bool ep);
// Grouped experts fed `rows` rows spread evenly over their local experts (x, probs, fc1 output, activation).
int64_t grouped_experts_stash_bytes(const ExpertsConfig& e, int64_t rows);
// Shared experts on the layer's input (its f32 input counted by the MoE layer).
int64_t shared_experts_stash_bytes(const MoELayerConfig& c, const nn::StashDims& d, bool input_dropped);
// MoE layer: all of the above for its T = S/TP·B tokens, T·K routed rows balanced over the EP ranks (Megatron's
// estimator plans the same: tokens × top-K, no imbalance), gathered over ETP; only the input under moe recompute.
int64_t moe_layer_stash_bytes(const MoELayerConfig& c, int64_t ep, int64_t etp, const nn::StashDims& d,
                              bool input_dropped);

}  // namespace moecore::moe
