// Activations in the memory plan (memory_plan.h): the modules' own stash sizes (nn/stash_bytes.h, each defined
// next to its module's forward) summed over the layers of one pipeline rank's model chunks, then the pipeline
// schedule walked pass by pass (pipeline_order, the order the trainer runs) to find how many micro-batches'
// stashes are alive at once. No formula of its own: the module configurations come from the flags exactly as the
// model builder makes them.
#include <fmt/format.h>

#include <algorithm>

#include "moecore/kernels/attention.h"
#include "moecore/moe/moe_layer.h"
#include "moecore/nn/gpt_model.h"
#include "moecore/nn/mla_attention.h"
#include "moecore/nn/mlp.h"
#include "moecore/nn/self_attention.h"
#include "moecore/nn/stash_bytes.h"
#include "moecore/train/memory_plan.h"
#include "moecore/train/model_builder.h"
#include "moecore/train/pipeline/pipeline_schedule.h"
#include "moecore/train/pipeline/pipeline_stages.h"

namespace moecore::train {

namespace {

// A layer's backward allocates its gradients while its stash is still held: measured on the reference runs
// (tests/train/test_memory_plan_measured.cpp) at about this fraction of the layer's whole stash as f32 training keeps
// it (0.6 while the MoE experts still copied their rows into and out of the padded layout). Under --bf16 the stash
// is bf16 but most gradients stay f32, so the fraction applies to the same layer's f32 stash.
constexpr double kBackwardTemporaries = 0.45;

// The modules' configurations as build_model gives them (sizes, bf16, recompute), without any group.
struct ModelShapes {
  nn::AttentionConfig attn;
  nn::MLAConfig mla;
  nn::NormKind norm = nn::NormKind::RMSNorm;
  nn::MLPConfig mlp;
  moe::MoELayerConfig moe;
  std::vector<bool> is_moe;
  nn::RecomputeConfig rc;
  int64_t hidden = 0;
};

ModelShapes model_shapes(const TrainConfig& c, int64_t padded_vocab) {
  const nn::GPTConfig g = gpt_config(c, padded_vocab);
  ModelShapes m;
  m.rc = recompute_config(c);
  m.hidden = g.hidden_size;
  m.norm = g.normalization;
  m.attn.hidden = g.hidden_size;
  m.attn.num_heads = g.num_attention_heads;
  m.attn.num_query_groups = g.num_query_groups;
  m.attn.head_dim = g.kv_channels;
  m.attn.qk_layernorm = g.qk_layernorm;
  m.attn.low = g.low;
  m.attn.qk_norm_kind = g.normalization;
  m.attn.recompute_core_attn = m.rc.core_attn;
  m.mla = g.mla;
  m.mla.recompute_up_proj = m.rc.mla_up_proj;
  m.mlp.hidden = g.hidden_size;
  m.mlp.ffn_hidden = g.ffn_hidden_size;
  m.mlp.activation = g.activation;
  m.mlp.bias = g.add_bias_linear;  // keeps fc1's output in f32 under bf16
  m.mlp.low = g.low;
  m.mlp.recompute = m.rc.mlp;
  m.is_moe = c.is_moe_layer;
  MOE_ASSERT(std::ssize(m.is_moe) == c.num_layers);
  if (c.num_experts > 0) {
    m.moe = moe_layer_config(c);
    m.moe.recompute_moe = m.rc.moe;
    m.moe.recompute_moe_act = m.rc.moe_act;
    m.moe.recompute_shared_experts = m.rc.shared_experts;
  }
  return m;
}

// Layer i's FFN stash after its forward.
int64_t ffn_bytes(const ModelShapes& m, const PlanLayout& l, int64_t i, const nn::StashDims& d) {
  return m.is_moe[static_cast<size_t>(i)] ? moe::moe_layer_stash_bytes(m.moe, l.ep, l.etp, d, m.rc.layernorm)
                                          : nn::mlp_stash_bytes(m.mlp, d, m.rc.layernorm);
}

// One layer's stash after its forward, nothing recomputed by full recompute.
double layer_bytes(const ModelShapes& m, const PlanLayout& l, int64_t i, const nn::StashDims& d) {
  return static_cast<double>(nn::layer_stash_bytes(m.attn, m.mla, m.norm, m.rc.layernorm, ffn_bytes(m, l, i, d), d));
}

std::vector<StageLayers> chunks_of(const TrainConfig& c, int64_t pp_rank) {
  if (c.pipeline_model_parallel_size <= 1) return {StageLayers{0, c.num_layers, true, true, 0}};
  return pipeline_stage_layers(c, pp_rank);
}

// The same model with no recompute: what a layer's stash holds when nothing is dropped.
ModelShapes without_recompute(ModelShapes m) {
  m.rc = nn::RecomputeConfig{};
  m.attn.recompute_core_attn = false;
  m.mla.recompute_up_proj = false;
  m.mlp.recompute = false;
  m.moe.recompute_moe = m.moe.recompute_moe_act = m.moe.recompute_shared_experts = false;
  return m;
}

}  // namespace

StageActivations stage_activations(const TrainConfig& c, int64_t padded_vocab, const PlanLayout& l, int64_t pp_rank) {
  const ModelShapes m = model_shapes(c, padded_vocab), whole = without_recompute(m);
  nn::StashDims d;
  d.S = c.seq_length / std::max<int64_t>(l.cp, 1);  // context parallelism: each rank holds S / CP of the sequence
  d.B = c.micro_batch_size;
  d.tp = l.tp;
  d.cp = std::max<int64_t>(l.cp, 1);
  d.low = low_precision(c);
  d.gpu = plans_gpu(c);
  nn::StashDims d32 = d;  // the same micro-batch in f32: what the backward's gradients scale with
  d32.low = std::nullopt;
  StageActivations a;
  // --bf16: the backward temporaries of the bf16 attention kernel this CPU runs (the oneDNN kernel's largest block;
  // the native flash kernel's packed operands and dQ accumulator) are alive during each attention's backward.
  double attention_kernel = 0;
  if (d.low == DType::BF16 && l.cp <= 1 && d.S <= kernels::kMaxBf16AttentionSeq) {
    const int64_t width = m.mla.enabled ? m.mla.kernel_head_dim() : m.attn.head_dim;
    const int64_t tp = std::max<int64_t>(l.tp, 1), heads = m.attn.num_heads / tp;
    const int64_t kv_heads = m.mla.enabled ? heads : std::max<int64_t>(m.attn.num_query_groups / tp, 1);
    attention_kernel = static_cast<double>(kernels::attention_backward_bf16_bytes(d.S, d.B, heads, kv_heads, width));
    // A GPU runs its own kernel instead (kernels/cuda/attention_ops.cpp): Δ [B, N, S] in f32 and, where the
    // tensor-core backward splits a GQA group's heads over blocks, partial dK and dV per query head (at most two
    // f32 [S, B, N, D]).
    if (d.gpu)
      attention_kernel =
          static_cast<double>(nn::tensor_bytes(d.B * heads * d.S, DType::F32) +
                              (kv_heads < heads ? 2 * nn::tensor_bytes(d.S * d.B * heads * width, DType::F32) : 0));
  }
  // Beside it, what the attention's backward builds from its stash: MLA's o padded again, and under --bf16 the
  // operands widened where the kernel reads f32 only.
  attention_kernel += static_cast<double>(m.mla.enabled ? nn::mla_backward_rebuilt_bytes(m.attn, m.mla, d)
                                                        : nn::attention_backward_rebuilt_bytes(m.attn, d));
  double largest_layer = 0;  // the largest layer's kept stash
  for (const StageLayers& ch : chunks_of(c, pp_rank)) {
    double b = ch.embedding ? static_cast<double>(nn::embedding_stash_bytes(d)) : 0.0;
    for (int64_t k = 0; k < ch.num_layers; k++) {
      const int64_t i = ch.first_layer + k;
      const nn::RecomputeConfig::Chunk rc = m.rc.full ? m.rc.chunk(k, ch.num_layers) : nn::RecomputeConfig::Chunk{};
      const double kept = layer_bytes(m, l, i, d), all = layer_bytes(whole, l, i, d);
      largest_layer = std::max(largest_layer, kept);
      // Backward of layer i: what it rematerializes (a full-recompute chunk replayed whole at its last layer, or
      // what selective recompute dropped) and its gradient temporaries (kBackwardTemporaries of its whole f32 stash;
      // grads_attn: of the attention's part, the FFN's freed).
      const double ffn32 = static_cast<double>(ffn_bytes(whole, l, i, d32));
      const double grads = kBackwardTemporaries * layer_bytes(whole, l, i, d32);
      const double grads_attn = grads - kBackwardTemporaries * ffn32;
      double remat = all - kept;
      if (rc.on()) {
        remat = 0;
        for (int64_t j = rc.begin; j < rc.end; j++) remat += layer_bytes(m, l, ch.first_layer + j, d);
        b += static_cast<double>(nn::released_layer_stash_bytes(m.hidden, k == rc.begin, d));
      } else {
        b += kept;
      }
      // mla_up_proj rebuilds q, k and v in the attention's backward, after the layer's FFN backward has freed the
      // FFN's stash.
      if (!rc.on() && m.mla.enabled && m.mla.recompute_up_proj) {
        const double up = static_cast<double>(nn::mla_stash_bytes(m.attn, whole.mla, d, m.rc.layernorm) -
                                              nn::mla_stash_bytes(m.attn, m.mla, d, m.rc.layernorm));
        remat -= up;
        a.working = std::max(a.working, up + attention_kernel + grads - static_cast<double>(ffn_bytes(m, l, i, d)));
      }
      a.working = std::max(a.working, remat + grads);
      // The attention's backward runs after the layer's FFN backward has freed the FFN's stash; beside the kernel's
      // temporaries it holds the attention's own gradients.
      const double ffn = static_cast<double>(ffn_bytes(m, l, i, d));
      a.working = std::max(a.working, remat + attention_kernel + grads_attn - ffn);
    }
    if (ch.loss) {
      const double all = static_cast<double>(nn::loss_stash_bytes(m.hidden, padded_vocab, m.norm, d));
      const int64_t logits = d.rows() * (padded_vocab / d.tp);
      a.logits = static_cast<double>(nn::tensor_bytes(logits, d.logits()));  // bf16 with --bf16 on the CPU
      b += all - a.logits;
      // Multi-token prediction's depths (their layer of the last decoder layer's kind) hold theirs until backward.
      if (c.mtp_num_layers > 0) {
        const bool rc = m.rc.full && m.rc.method == nn::RecomputeConfig::Method::Uniform;
        b += static_cast<double>(c.mtp_num_layers) *
             static_cast<double>(nn::mtp_depth_stash_bytes(
                 m.hidden, padded_vocab, m.norm, d, rc, static_cast<int64_t>(layer_bytes(m, l, c.num_layers - 1, d))));
      }
    }
    a.chunk_bytes.push_back(b);
  }
  // Under TP a layer's backward also holds the all-gathered output gradient and its input gradient before the
  // reduce-scatter, both of the whole sequence.
  if (l.tp > 1) a.working += 2.0 * static_cast<double>(nn::tensor_bytes(d.rows() * m.hidden, DType::F32));
  // The schedule's passes in order: a forward adds its chunk's stash, a backward frees it.
  const int64_t v = static_cast<int64_t>(a.chunk_bytes.size()), P = std::max<int64_t>(l.pp, 1);
  const int64_t M = std::max<int64_t>(l.num_microbatches, 1);
  // Megatron's combined 1F1B (without pipelining, or interleaved): its order has one warm-up forward more, and each
  // steady-state forward runs merged with the backward after it (pipeline_order).
  const bool combined = combined_1f1b(c) && (P == 1 || v > 1);
  const std::vector<PipelinePass> order =
      pipeline_order(M, P, std::min(pp_rank, P - 1), v, c.microbatch_group_size_per_vp_stage, false, combined);
  auto bytes = [&](const PipelinePass& p) {
    return a.chunk_bytes[static_cast<size_t>(p.chunk)] + (p.chunk == v - 1 ? a.logits : 0.0);
  };
  // In a merged pair one micro-batch's all-to-all stays in flight while the other computes, so its send and receive
  // buffers (the largest: the combine's, f32 both ways) come on top of what the computing side holds.
  double in_flight_exchange = 0;
  if (combined)
    for (const MemoryPlan::Buffer& buf : dispatch_buffers(c, l))
      if (buf.name.rfind("combine all-to-all", 0) == 0) in_flight_exchange += buf.bytes;
  double live = 0;
  for (size_t k = 0; k < order.size(); k++) {
    const PipelinePass& p = order[k];
    if (p.merged) {
      // A merged pair runs forward layer i beside backward layer L−1−i: the backward's stash, still held, and one
      // layer more of the forward's, with both micro-batches' logits where either is the loss chunk's, and the other
      // side's exchange in flight; once the backward has ended, the forward's rest (a larger chunk's).
      const PipelinePass& b = order[k + 1];
      const double logits = p.chunk == v - 1 || b.chunk == v - 1 ? a.logits : 0.0;
      a.peak = std::max(a.peak, live + std::max(largest_layer + logits + in_flight_exchange, bytes(p) - bytes(b)));
      live += bytes(p) - bytes(b);
      k++;
      continue;
    }
    live += p.forward ? bytes(p) : -bytes(p);
    a.peak = std::max(a.peak, live);
  }
  double one = a.logits;
  for (double b : a.chunk_bytes) one += b;
  a.in_flight = one > 0 ? a.peak / one : 1.0;
  return a;
}

}  // namespace moecore::train
