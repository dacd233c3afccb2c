// Fine-grained activation offloading in the memory plan (memory_plan.h): which bytes of each layer's stash the
// --offload-modules move to host memory (activation_offload.h says which tensors), composed from the modules' own
// stash sizes (nn/stash_bytes.h) with each tensor kept apart where the threshold --min-offloaded-tensor-size may
// keep it on the device. Tensors laid out as the CPU lays them out, as the rest of the plan is.
#include <algorithm>

#include "moecore/core/error.h"
#include "moecore/moe/moe_layer.h"
#include "moecore/nn/gpt_model.h"
#include "moecore/nn/mla_attention.h"
#include "moecore/nn/self_attention.h"
#include "moecore/nn/stash_bytes.h"
#include "moecore/train/activation_offload.h"
#include "moecore/train/config/device_support.h"
#include "moecore/train/memory_plan.h"
#include "moecore/train/model_builder.h"
#include "moecore/train/pipeline/pipeline_stages.h"

namespace moecore::train {

namespace {

// The offloading of a run on the device the plan is for.
OffloadConfig planned_offload(const TrainConfig& c) {
  return offload_config(c, planned_device(c));
}

// Sums the bytes of the tensors at least `min_numel` elements long.
struct OffloadSum {
  int64_t min_numel = 0;
  int64_t bytes = 0;
  void add(int64_t numel, int64_t b) {
    if (numel > 0 && numel >= min_numel) bytes += b;
  }
};

int64_t offload_f32(int64_t n) {
  return nn::tensor_bytes(n, DType::F32);
}

// Each module's tensors below are the ones its stash_bytes function (nn/stash_bytes.h) counts, in the same dtypes:
// the kept activations in the GEMMs' input dtype (bf16 under --bf16, StashDims::gemm_input), the norms' statistics
// and the softmax's lse in f32. stage_offload checks that with every module offloaded and no threshold the tensors
// add up to the layer's stash bytes exactly, so that a change of a stash that is not made here fails every plan
// with offloading (and ActivationOffload.LiveBytesDropByThePlannedOffload measures the split).

// The attention's modules (attention_stash_bytes, tensor by tensor).
void attention_offload(const nn::AttentionConfig& a, const nn::StashDims& d, bool input_dropped,
                       const OffloadModules& m, OffloadSum& s) {
  const int64_t r = d.rows(), nq = a.num_heads / d.tp, nkv = a.num_query_groups / d.tp, D = a.head_dim;
  const DType gd = d.gemm_input();
  const auto kept = [&](int64_t n) { s.add(n, nn::tensor_bytes(n, gd)); };
  if (m.qkv_linear) {
    if (!input_dropped) kept(r * a.hidden);  // q/k/v's one shared input (the input norm's output, gathered)
    if (a.qk_layernorm) {
      // The projections' outputs as the qk-norms keep them, and their statistics.
      kept(r * nq * D), kept(r * nkv * D);
      s.add(r * nq, nn::norm_stash_bytes(r * nq, a.qk_norm_kind));
      s.add(r * nkv, nn::norm_stash_bytes(r * nkv, a.qk_norm_kind));
    }
  }
  if (m.core_attn) {
    kept(r * nq * D), kept(r * nkv * D), kept(r * nkv * D);          // the kernel's q, k, v
    if (!a.recompute_core_attn) s.add(r * nq, offload_f32(r * nq));  // lse
  }
  // o: kept only as the output projection's input (in f32 also as core_attn's o, the same tensor: it moves only
  // with attn_proj, which needs core_attn); none under core_attn recompute.
  if (m.attn_proj && !a.recompute_core_attn) kept(r * nq * D);
}

// Multi-Latent Attention's modules (mla_stash_bytes, tensor by tensor). o is not kept (backward pads it again from
// the output projection's input).
void mla_offload(const nn::AttentionConfig& a, const nn::MLAConfig& ml, const nn::StashDims& d, bool input_dropped,
                 const OffloadModules& m, OffloadSum& s) {
  const int64_t r = d.rows(), rl = d.local_rows(), H = a.hidden, nh = a.num_heads / d.tp;
  const int64_t da = ml.kernel_head_dim(), R = ml.kv_lora_rank, Q = ml.q_lora_rank;
  const DType gd = d.gemm_input();
  const auto kept = [&](int64_t n) { s.add(n, nn::tensor_bytes(n, gd)); };
  if (m.qkv_linear) {
    // The layer's normed input: one tensor the down projections (or the q projection, ungathered) share.
    if (!input_dropped) kept(rl * H);
    if (Q > 0) {
      if (a.qk_layernorm) kept(rl * Q), s.add(rl, nn::norm_stash_bytes(rl, a.qk_norm_kind));  // q_norm's input
      kept(r * Q);                                                                            // q_up's input (gathered)
    } else if (!input_dropped && d.tp > 1) {
      kept(r * H);  // linear_q_proj's input: the gathered x
    }
    if (a.qk_layernorm) kept(rl * R), s.add(rl, nn::norm_stash_bytes(rl, a.qk_norm_kind));  // kv_norm's input
    kept(r * R);                                                                            // kv_up's input
    if (ml.recompute_up_proj) kept(r * ml.qk_pos_emb_head_dim);  // the rope key (q, k, v rebuilt from it)
  }
  if (m.core_attn) {
    if (!ml.recompute_up_proj) kept(r * nh * da), kept(r * nh * da), kept(r * nh * da);  // q, k, v padded
    if (!a.recompute_core_attn) s.add(r * nh, offload_f32(r * nh));                      // lse
  }
  if (m.attn_proj && !a.recompute_core_attn) kept(r * nh * ml.v_head_dim);  // o's values, unpadded
}

// The routed experts' modules (grouped_experts_stash_bytes taken apart: x, probabilities, fc1's output, the
// activation), for the rows moe_layer_stash_bytes plans; returns grouped_experts_stash_bytes, the FFN's part of the
// layer's stash that offloading covers (0 under moe recompute: only the layer's input is kept). The element counts
// (for the threshold) are the bytes over the dtype's size: every tensor but the f32 probabilities is kept in the
// GEMMs' input dtype (fc1's output too: written in bf16, or rounded after its bias).
int64_t experts_offload(const moe::MoELayerConfig& c, int64_t ep, int64_t etp, const nn::StashDims& d,
                        const OffloadModules& m, OffloadSum& s) {
  if (c.recompute_moe) return 0;
  const int64_t T = d.local_rows(), E = c.router.num_experts;
  int64_t rows = T * c.router.topk;
  if (c.router.capacity_factor >= 0 && c.router.pad_to_capacity)
    rows = E * std::min(moe::expert_capacity(c.router, T), T);
  moe::ExpertsConfig e{c.router.hidden, c.ffn_hidden / etp, E / ep, 0, c.activation, 0, 0, c.low};
  e.recompute_act = c.recompute_moe_act;
  e.bias = c.bias;
  e.etp_size = etp;
  const int64_t R = rows * etp;
  moe::ExpertsConfig no_ffn = e, no_rows = e, act_dropped = e;
  no_ffn.ffn_hidden = 0;
  no_rows.ffn_hidden = no_rows.hidden = 0;
  act_dropped.recompute_act = true;
  const int64_t all = moe::grouped_experts_stash_bytes(e, R), xp = moe::grouped_experts_stash_bytes(no_ffn, R);
  const int64_t p = moe::grouped_experts_stash_bytes(no_rows, R), x = xp - p;
  const int64_t a = all - moe::grouped_experts_stash_bytes(act_dropped, R), h = all - xp - a;
  const int64_t xs = dtype_size(d.gemm_input());
  if (m.expert_fc1 || m.fused_group_mlp) s.add(x / xs, x);
  if (m.moe_act || m.fused_group_mlp) s.add(p / 4, p), s.add(h / xs, h), s.add(a / xs, a);
  return all;
}

}  // namespace

StageOffload stage_offload(const TrainConfig& c, int64_t padded_vocab, const PlanLayout& l, int64_t pp_rank) {
  const OffloadConfig oc = planned_offload(c);
  StageOffload o;
  if (!oc.modules.any()) return o;
  const nn::GPTConfig g = gpt_config(c, padded_vocab);
  const nn::RecomputeConfig rc = recompute_config(c);
  nn::AttentionConfig a;
  a.hidden = g.hidden_size, a.num_heads = g.num_attention_heads, a.num_query_groups = g.num_query_groups;
  a.head_dim = g.kv_channels, a.qk_layernorm = g.qk_layernorm, a.low = g.low, a.qk_norm_kind = g.normalization;
  a.bias = g.add_bias_linear, a.recompute_core_attn = rc.core_attn;
  nn::MLAConfig ml = g.mla;
  ml.recompute_up_proj = rc.mla_up_proj;
  moe::MoELayerConfig mc;
  if (c.num_experts > 0) {
    mc = moe_layer_config(c);
    mc.recompute_moe = rc.moe, mc.recompute_moe_act = rc.moe_act, mc.recompute_shared_experts = rc.shared_experts;
  }
  nn::StashDims d;
  d.S = c.seq_length / std::max<int64_t>(l.cp, 1);
  d.B = c.micro_batch_size, d.tp = l.tp, d.cp = std::max<int64_t>(l.cp, 1), d.low = low_precision(c);
  const std::vector<StageLayers> chunks = c.pipeline_model_parallel_size <= 1
                                              ? std::vector<StageLayers>{StageLayers{0, c.num_layers, true, true, 0}}
                                              : pipeline_stage_layers(c, pp_rank);
  OffloadModules every;  // the check's: every module that a layer's stash has tensors of
  every.attn_norm = every.qkv_linear = every.core_attn = every.attn_proj = every.mlp_norm = true;
  every.expert_fc1 = every.moe_act = true;
  // One layer's offloaded bytes under `m`, tensors under `min_numel` elements kept; *experts: the routed experts'
  // stash bytes (0 for a dense layer).
  const auto layer_offload = [&](bool moe_layer, const OffloadModules& m, int64_t min_numel, int64_t* experts) {
    OffloadSum s{min_numel};
    const int64_t rl = d.local_rows(), H = g.hidden_size;
    for (const bool norm : {m.attn_norm, m.mlp_norm})  // the norm's input (bf16 under --bf16) and statistics
      if (norm)
        s.add(rl * H, nn::tensor_bytes(rl * H, d.gemm_input())), s.add(rl, nn::norm_stash_bytes(rl, g.normalization));
    ml.enabled ? mla_offload(a, ml, d, rc.layernorm, m, s) : attention_offload(a, d, rc.layernorm, m, s);
    *experts = moe_layer ? experts_offload(mc, l.ep, l.etp, d, m, s) : 0;
    return s.bytes;
  };
  for (const StageLayers& ch : chunks)
    for (int64_t k = 0; k < ch.num_layers; k++) {
      if (rc.full && rc.chunk(k, ch.num_layers).on()) continue;  // a recompute chunk keeps nothing to offload
      const int64_t i = ch.first_layer + k;
      const bool moe_layer = c.num_experts > 0 && c.is_moe_layer[static_cast<size_t>(i)];
      int64_t experts = 0;
      const int64_t bytes = layer_offload(moe_layer, oc.modules, oc.min_numel, &experts);
      // Every module, no threshold: the whole stash but the FFN's parts no module covers (router, dispatcher,
      // shared experts, a dense MLP), tensor by tensor as the modules' stash_bytes count it.
      const int64_t all = layer_offload(moe_layer, every, 0, &experts);
      const int64_t stash = nn::layer_stash_bytes(a, ml, g.normalization, rc.layernorm, experts, d);
      MOE_ASSERT_MSG(all == stash,
                     "the offload plan's tensors ({} bytes) differ from the layer's stash bytes ({}): "
                     "memory_plan_offload.cpp is behind a module's stash",
                     all, stash);
      o.per_micro_batch += static_cast<double>(bytes);
      o.largest_layer = std::max(o.largest_layer, static_cast<double>(bytes));
    }
  return o;
}

void apply_activation_offload(const TrainConfig& c, int64_t padded_vocab, const PlanLayout& l, MemoryPlan& m) {
  const StageOffload o = stage_offload(c, padded_vocab, l, m.pp_rank);
  if (o.per_micro_batch <= 0) return;
  // On the device beside the stashes that stay: the layers whose copy to the host compute has not waited for yet,
  // the layer in backward and the one prefetched behind it.
  const double window = static_cast<double>(planned_offload(c).max_inflight + 2) * o.largest_layer;
  m.offloaded = o.per_micro_batch;
  m.host_offloaded = o.per_micro_batch * m.in_flight;
  m.offload_window = std::min(m.host_offloaded, window);
  m.peak_activations += m.offload_window - m.host_offloaded;
}

}  // namespace moecore::train
