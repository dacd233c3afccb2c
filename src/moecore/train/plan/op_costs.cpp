// One layer's op classes on one rank (see op_costs.h).
#include "moecore/train/plan/op_costs.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>

#include "moecore/core/error.h"
#include "moecore/train/model_builder.h"
#include "moecore/train/observe/cost_model.h"

namespace moecore::train::plan {

namespace {

bool fp8_on(const TrainConfig& c) {
  return !c.fp8_format.empty();
}
double act_bytes(const TrainConfig& c) {
  return c.bf16 || c.fp16 ? 2.0 : 4.0;
}

// The rank's view of a micro-batch: T tokens of its sequence shard (S·B/CP), Tsp = T/TP of them where sequence
// parallelism splits them (norms, residuals, the MoE dispatcher).
struct Shape {
  double S, T, Tsp, H, TP, e;
};
Shape shape_of(const TrainConfig& c, const PlanLayout& l) {
  const double T = static_cast<double>(c.seq_length * c.micro_batch_size) / static_cast<double>(l.cp);
  return {static_cast<double>(c.seq_length), T,
          T / static_cast<double>(l.tp),     static_cast<double>(c.hidden_size),
          static_cast<double>(l.tp),         act_bytes(c)};
}

// A GEMM [m, k] x [k, n] and its backward, the data gradient ([m, n] x [n, k]) and the weight gradient ([k, m] x
// [m, n]): each one kernel priced as a roofline at its own shape, the larger of its FLOPs at the rate that shape
// reaches (GpuSpec's contraction overhead and fixed part; `grouped`: one expert's GEMM inside TransformerEngine's
// grouped GEMM) and its bytes at the achievable HBM bandwidth, plus one launch. Under FP8 the casts of its operands
// (read, amax read under current scaling, write) and on Hopper the transposed copies its weight-gradient GEMM
// needs, as memory-bound time. Returns forward and backward seconds.
struct Gemm {
  double fwd = 0, bwd = 0, cast_fwd = 0, cast_bwd = 0;
};
Gemm gemm(const TrainConfig& c, const GpuSpec& g, double m, double n, double k, bool allow_fp8 = true,
          bool grouped = false) {
  Gemm out;
  if (m <= 0 || n <= 0 || k <= 0) return out;
  const bool fp8 = allow_fp8 && fp8_on(c);
  const double eb = fp8 ? 1.0 : act_bytes(c);
  const double rate = fp8 ? g.achievable_fp8() : (c.bf16 || c.fp16 ? g.achievable_bf16() : g.achievable_bf16() / 4);
  const double hbm = g.hbm_bandwidth * g.hbm_efficiency;
  const double bytes = (m * k + k * n) * eb + m * n * act_bytes(c);
  auto pass = [&](double rows, double cols, double contraction) {
    const double compute = gemm_kernel_seconds(g, rows, cols, contraction, rate, grouped);
    return std::max(compute, bytes / hbm) + g.kernel_launch_seconds;
  };
  out.fwd = pass(m, n, k);
  out.bwd = pass(m, k, n) + pass(k, n, m);
  if (fp8) {
    const double e = act_bytes(c);
    const double per = c.fp8_recipe == "delayed" ? e + 1 : 2 * e + 1;  // current scaling reads once more for amax
    out.cast_fwd = (m * k + n * k) * per / hbm;
    out.cast_bwd = (m * n * per + (g.name[0] == 'h' ? 2 * (m * k + m * n) : 0)) / hbm;
  }
  return out;
}

void add(OpTimes& fwd, OpTimes& bwd, double OpTimes::*cls, const Gemm& x) {
  fwd.*cls += x.fwd;
  bwd.*cls += x.bwd;
  fwd.memory += x.cast_fwd;
  bwd.memory += x.cast_bwd;
}

// Any load-balancing loss with a nonzero coefficient (Megatron's --moe-aux-loss-coeff takes one per type).
bool aux_loss_on(const TrainConfig& c) {
  for (const std::string& x : c.moe_aux_loss_coeff)
    if (std::strtod(x.c_str(), nullptr) != 0) return true;
  return false;
}

double hbm_seconds(const GpuSpec& g, double bytes) {
  return bytes / (g.hbm_bandwidth * g.hbm_efficiency);
}

// Peers of a group of `size` ranks `stride` apart that share this rank's NVLink domain (this rank included).
double peers_inside(int64_t stride, int64_t size, const GpuSpec& g) {
  const int64_t dom = g.gpus_per_nvlink_domain;
  if (stride * size <= dom) return static_cast<double>(size);
  return static_cast<double>(std::max<int64_t>(1, std::min<int64_t>(size, dom / std::max<int64_t>(stride, 1))));
}

// Ring collectives run at the slowest link of the ring: NVLink inside a domain, the network otherwise.
double ring_busbw(int64_t stride, int64_t size, const GpuSpec& g) {
  if (size <= 1) return g.nccl_busbw_nvlink;
  return peers_inside(stride, size, g) >= static_cast<double>(size) ? g.nccl_busbw_nvlink : g.nccl_busbw_network;
}

// An all-to-all's bytes split by where the peers are; both parts move at once.
double alltoall_busbw(int64_t stride, int64_t size, const GpuSpec& g) {
  if (size <= 1) return g.nccl_busbw_nvlink;
  const double inside = (peers_inside(stride, size, g) - 1) / static_cast<double>(size - 1);
  const double t = std::max(inside / g.nccl_busbw_nvlink, (1 - inside) / g.alltoall_busbw_network);
  return 1 / t;
}

// One direction of one MoE layer's EP communication for one micro-batch. The flex dispatcher's backends (DeepEP,
// HybridEP) cross the network once per token and destination node (then forward over NVLink): the network carries
// each token to the other nodes holding one of its k experts (k of E uniform, at most the group-limited routing's
// --moe-router-group-topk groups where groups align with nodes); the cost model's per-rank bytes go over NVLink.
// Other dispatchers: the cost model's bytes over the all-to-all's bus bandwidth.
double ep_seconds(const TrainConfig& c, const PlanLayout& l, const GpuSpec& g, const Links& links, double bytes) {
  const double inside = peers_inside(l.etp, l.ep, g);
  if (c.moe_token_dispatcher_type != "flex" || inside >= static_cast<double>(l.ep)) return bytes / links.ep;
  const double nodes = static_cast<double>(l.ep) / inside, E = static_cast<double>(c.num_experts);
  const double per_node = E / nodes;
  double miss = 1;
  for (int64_t i = 0; i < c.moe_router_topk; i++) miss *= std::max(0.0, (E - per_node - i) / (E - i));
  double reached = nodes * (1 - miss);
  if (c.moe_router_num_groups > 0 && c.moe_router_group_topk > 0 && c.moe_router_num_groups >= nodes)
    reached = std::min(reached, static_cast<double>(c.moe_router_group_topk) *
                                    std::max(1.0, nodes / static_cast<double>(c.moe_router_num_groups)));
  const double other_nodes = reached * (nodes - 1) / nodes;
  const double T = static_cast<double>(c.seq_length * c.micro_batch_size) / static_cast<double>(l.cp * l.tp);
  const double H = static_cast<double>(c.hidden_size), e = act_bytes(c);
  const double network = T * other_nodes * H * 2 * e;  // dispatch and combine of one direction
  return std::max(network / g.nccl_busbw_network, bytes / g.nccl_busbw_nvlink);
}

// Communication of `comm` seconds overlapped with `compute` seconds: what exceeds the compute is exposed, and while
// it runs beside the compute its kernels take their SMs from it (GpuSpec::overlap_cost).
double hidden_cost(const GpuSpec& g, double comm, double compute) {
  const double hidden = std::min(comm, compute);
  return (comm - hidden) + hidden * g.overlap_cost();
}

}  // namespace

double gemm_kernel_seconds(const GpuSpec& g, double m, double n, double k, double rate, bool grouped) {
  const double fixed = g.gemm_fixed_seconds * (grouped ? g.grouped_gemm_fixed_share : 1.0);
  return 2 * m * n * k / (rate * k / (k + g.gemm_k_overhead)) + fixed;
}

Links links_of(const PlanLayout& l, const GpuSpec& g) {
  Links k;
  k.tp = ring_busbw(1, l.tp, g);
  k.cp = ring_busbw(l.tp, l.cp, g);
  k.dp = ring_busbw(l.tp * l.cp, l.dp, g);
  k.etp = ring_busbw(1, l.etp, g);
  k.ep = alltoall_busbw(l.etp, l.ep, g);
  k.edp = ring_busbw(l.etp * l.ep, l.edp, g);
  // Stage neighbours are TP·CP·DP ranks apart: NVLink only where the whole pipeline fits in one domain; a P2P
  // transfer taken at the collectives' bus bandwidth of that link.
  k.pp = l.tp * l.cp * l.dp * l.pp <= g.gpus_per_nvlink_domain ? g.nccl_busbw_nvlink : g.nccl_busbw_network;
  auto lat = [&](int64_t stride, int64_t size) {
    return peers_inside(stride, size, g) >= static_cast<double>(size) ? g.collective_latency_nvlink
                                                                      : g.collective_latency_network;
  };
  k.latency = {lat(1, l.tp),
               lat(l.tp, l.cp),
               lat(l.tp * l.cp, l.dp),
               k.pp == g.nccl_busbw_nvlink ? g.collective_latency_nvlink : g.collective_latency_network,
               lat(l.etp, l.ep),
               lat(1, l.etp),
               lat(l.etp * l.ep, l.edp)};
  return k;
}

LayerBytes layer_bytes(const TrainConfig& c, const PlanLayout& l) {
  // The cost model's per-step bytes of one micro-batch, activations only (no parameters), in the run's precision.
  CommSizes z;
  z.tp = l.tp, z.dp = l.dp, z.ep = l.ep, z.etp = l.etp, z.edp = l.edp, z.num_microbatches = 1;
  z.activation_bytes = act_bytes(c);
  const std::map<std::string, double> b = analytic_comm_bytes(c, z);
  auto at = [&](const char* k) { return b.count(k) ? b.at(k) : 0.0; };
  const double L = static_cast<double>(c.num_layers);
  const double Lm = static_cast<double>(std::count(c.is_moe_layer.begin(), c.is_moe_layer.end(), true));
  const double Ld = L - Lm;
  const bool shared = c.moe_shared_expert_intermediate_size > 0;
  LayerBytes out;
  // tp: 2 directions x blocks (2 ends, 2 per attention, 2 per dense or shared MLP); the cross-entropy's
  // all-reduce goes with the ends.
  const double blocks = 2.0 + 2.0 * (L + Ld + (shared ? Lm : 0.0));
  const double TP = static_cast<double>(l.tp), T = static_cast<double>(c.seq_length * c.micro_batch_size);
  const double xent = 2 * (TP - 1) / TP * 3 * T * 4;
  const double per_block = l.tp > 1 ? (at("tp") - xent) / (2 * blocks) : 0.0;
  out.tp_dense_layer = 4 * per_block;
  out.tp_moe_layer = (shared ? 4 : 2) * per_block;
  out.tp_ends = 2 * per_block + xent / 2;
  if (Lm > 0) {
    out.ep_moe_layer = at("ep") / (2 * Lm);
    out.etp_moe_layer = at("etp") / (2 * Lm);
  }
  // Context parallelism splits the sequence: the cost model counts tokens of the whole sequence.
  const double CP = static_cast<double>(l.cp);
  out.tp_dense_layer /= CP, out.tp_moe_layer /= CP, out.tp_ends /= CP, out.ep_moe_layer /= CP;
  out.etp_moe_layer /= CP;
  return out;
}

LayerTimes layer_times(const TrainConfig& c, const PlanLayout& l, const GpuSpec& g, const Links& links,
                       const LayerBytes& bytes, const PlanOptions& options, bool moe_layer, bool full_recompute) {
  const Shape s = shape_of(c, l);
  const nn::RecomputeConfig rc = recompute_config(c);
  OpTimes af, ab, mf, mb;   // attention block, MLP block: forward, backward
  OpTimes rc_attn, rc_mlp;  // selective recompute's extra forward
  const double TP = s.TP, H = s.H, T = s.T, e = s.e;
  // Attention: projections, the causal core (each token attends to S/2 keys on average), norms, RoPE, residual.
  double heads = static_cast<double>(c.num_attention_heads) / TP, dqk = 0, dv = 0;
  if (c.multi_latent_attention) {
    const double N = heads, qk = static_cast<double>(c.qk_head_dim), rope = static_cast<double>(c.qk_pos_emb_head_dim);
    const double v = static_cast<double>(c.v_head_dim), ql = static_cast<double>(c.q_lora_rank),
                 kl = static_cast<double>(c.kv_lora_rank);
    dqk = qk + rope, dv = v;
    Gemm up_q, up_kv;
    if (c.q_lora_rank > 0) {
      add(af, ab, &OpTimes::dense_gemm, gemm(c, g, T, ql, H));  // down projections: duplicated over TP
      up_q = gemm(c, g, T, N * (qk + rope), ql);
    } else {
      up_q = gemm(c, g, T, N * (qk + rope), H);
    }
    add(af, ab, &OpTimes::dense_gemm, gemm(c, g, T, kl + rope, H));
    up_kv = gemm(c, g, T, N * (qk + v), kl);
    add(af, ab, &OpTimes::dense_gemm, up_q);
    add(af, ab, &OpTimes::dense_gemm, up_kv);
    add(af, ab, &OpTimes::dense_gemm, gemm(c, g, T, H, N * v));
    const double latent_norms = hbm_seconds(g, 2 * T * (ql + kl) * e);
    const double rope_mem = hbm_seconds(g, 2 * 2 * T * N * rope * e);
    af.memory += latent_norms + rope_mem;
    ab.memory += 2 * (latent_norms + rope_mem);
    if (rc.mla_up_proj) {
      rc_attn.dense_gemm += up_q.fwd + up_kv.fwd;
      rc_attn.memory += up_q.cast_fwd + up_kv.cast_fwd + rope_mem;
    }
  } else {
    const double D = static_cast<double>(c.kv_channels), Nkv = static_cast<double>(c.num_query_groups) / TP;
    dqk = dv = D;
    add(af, ab, &OpTimes::dense_gemm, gemm(c, g, T, (heads + 2 * Nkv) * D, H));
    add(af, ab, &OpTimes::dense_gemm, gemm(c, g, T, H, heads * D));
    const double rope_mem = hbm_seconds(g, 2 * T * (heads + Nkv) * D * e);
    // --qk-layernorm: a norm over every query and key head (read and write), as RoPE moves them.
    const double qk_norm = c.qk_layernorm ? rope_mem : 0.0;
    af.memory += rope_mem + qk_norm;
    ab.memory += 2 * (rope_mem + qk_norm);
  }
  const double core = 2 * T * (s.S / 2) * heads * (dqk + dv);  // forward FLOPs
  const double core_fwd = core / (g.attention_fwd_efficiency * g.peak_bf16);
  af.attention += core_fwd;
  ab.attention += 2.5 * core / (g.attention_bwd_efficiency * g.peak_bf16);  // FlashAttention's backward: 5 GEMMs
  if (rc.core_attn) rc_attn.attention += core_fwd;
  const double norm = hbm_seconds(g, 2 * s.Tsp * H * e), residual = hbm_seconds(g, 3 * s.Tsp * H * e);
  af.memory += norm + residual, ab.memory += 2 * (norm + residual);
  mf.memory += norm + residual, mb.memory += 2 * (norm + residual);
  if (rc.layernorm) rc_attn.memory += 2 * norm;
  // Context parallelism: K and V of the other CP ranks' shards pass around the ring (backward: their gradients
  // too), overlapped with the attention blocks by Megatron's ring.
  if (l.cp > 1) {
    const double kv = T * heads * (dqk + dv) * e * static_cast<double>(l.cp - 1);
    const double steps = static_cast<double>(l.cp - 1) * links.latency.cp;  // one ring step per other shard
    af.cp += hidden_cost(g, kv / links.cp + steps, core_fwd);
    ab.cp += hidden_cost(g, 2 * kv / links.cp + steps, ab.attention);
  }
  // MLP: dense, or routed experts (+ shared experts).
  const double gated = c.swiglu ? 2.0 : 1.0;
  // A tensor-parallel FFN of width F (this rank's) over the layer's tokens, the dense MLP's or the shared experts':
  // its two GEMMs and its activation added to the MLP's times; their forward seconds returned for recompute.
  struct Ffn {
    double fwd, cast_fwd, act;
  };
  auto dense_ffn = [&](double F) {
    const Gemm fc1 = gemm(c, g, T, gated * F, H), fc2 = gemm(c, g, T, H, F);
    add(mf, mb, &OpTimes::dense_gemm, fc1);
    add(mf, mb, &OpTimes::dense_gemm, fc2);
    const double act = hbm_seconds(g, (gated + 1) * T * F * e);
    mf.memory += act, mb.memory += 2 * act;
    return Ffn{fc1.fwd + fc2.fwd, fc1.cast_fwd + fc2.cast_fwd, act};
  };
  double mlp_gemm_fwd = 0;
  if (!moe_layer) {
    const Ffn f = dense_ffn(static_cast<double>(c.ffn_hidden_size) / TP);
    if (rc.mlp) rc_mlp.dense_gemm += f.fwd, rc_mlp.memory += f.act + f.cast_fwd;
    if (rc.moe_act) rc_mlp.memory += f.act;
    mlp_gemm_fwd = f.fwd;
  } else {
    const double E = static_cast<double>(c.num_experts), k = static_cast<double>(c.moe_router_topk);
    const double EP = static_cast<double>(l.ep), ETP = static_cast<double>(l.etp);
    const double Fe = static_cast<double>(c.moe_ffn_hidden_size) / ETP, local = E / EP;
    const double rows = s.Tsp * k * ETP;  // rows this rank's experts get (uniform routing)
    const double per_expert = rows / local;
    Gemm fc1 = gemm(c, g, per_expert, gated * Fe, H, true, true), fc2 = gemm(c, g, per_expert, H, Fe, true, true);
    Gemm experts{(fc1.fwd + fc2.fwd) * local, (fc1.bwd + fc2.bwd) * local, (fc1.cast_fwd + fc2.cast_fwd) * local,
                 (fc1.cast_bwd + fc2.cast_bwd) * local};
    add(mf, mb, &OpTimes::expert_gemm, experts);
    add(mf, mb, &OpTimes::dense_gemm, gemm(c, g, s.Tsp, E, H, false));  // router
    // The router's [tokens, experts] f32 tensors: the logits read by the score function, the scores written and
    // read by the top-k, the probabilities and the routing map written, and with a load-balancing loss the scores
    // and the map read once more; the backward reads and writes them again.
    const double router = hbm_seconds(g, (5.0 + (aux_loss_on(c) ? 2.0 : 0.0)) * s.Tsp * E * 4);
    mf.memory += router, mb.memory += 2 * router;
    const double act = hbm_seconds(g, (gated + 1) * rows * Fe * e);
    const double permute = hbm_seconds(g, 2 * (s.Tsp + s.Tsp * k) * H * e);  // permute and unpermute
    mf.memory += act + permute, mb.memory += 2 * (act + permute);
    if (rc.moe_act) rc_mlp.memory += act;
    double shared_fwd = 0;
    if (c.moe_shared_expert_intermediate_size > 0) {
      const Ffn sh = dense_ffn(static_cast<double>(c.moe_shared_expert_intermediate_size) / TP);
      shared_fwd = sh.fwd;
      if (rc.shared_experts) rc_mlp.dense_gemm += shared_fwd, rc_mlp.memory += sh.act;
    }
    mlp_gemm_fwd = shared_fwd;
    // EP all-to-all and ETP gathers: exposed, or with --overlap-moe-expert-parallel-comm hidden behind another
    // micro-batch's compute of the same layer (Megatron's combined 1F1B schedule).
    // Collectives per direction: forward the token counts' all-gather, the dispatch and the combine; backward the
    // two all-to-alls. Each pays the group's latency on top of its bytes.
    const double ep = ep_seconds(c, l, g, links, bytes.ep_moe_layer), etp = bytes.etp_moe_layer / links.etp;
    // ETP's calls: 7 per MoE layer and micro-batch as moecore's communication counters count them under TP 2 (one
    // all-gather of the token counts, three variable-size all-gathers, three reduce-scatters), taken as 4 in the
    // forward and 3 in the backward.
    const double ep_lat = l.ep > 1 ? links.latency.ep : 0.0, etp_lat = l.etp > 1 ? links.latency.etp : 0.0;
    const double ep_f = ep + 3 * ep_lat, ep_b = ep + 2 * ep_lat;
    if (c.overlap_moe_expert_parallel_comm) {
      mf.ep += hidden_cost(g, ep_f, af.compute() + mf.compute());
      mb.ep += hidden_cost(g, ep_b, ab.compute() + mb.compute());
    } else {
      mf.ep += ep_f, mb.ep += ep_b;
    }
    mf.etp += etp + 4 * etp_lat, mb.etp += etp + 3 * etp_lat;
    if (rc.moe) rc_mlp += mf;
  }
  // Tensor parallelism with sequence parallelism: exposed, or with --tp-comm-overlap hidden behind the GEMMs.
  // One all-gather or reduce-scatter per block end: 4 per layer and direction, 2 in a MoE layer without shared
  // experts (its dispatcher's own gathers are the EP group's).
  const double tp_calls = l.tp > 1 ? (!moe_layer || c.moe_shared_expert_intermediate_size > 0 ? 4.0 : 2.0) : 0.0;
  const double tp = (moe_layer ? bytes.tp_moe_layer : bytes.tp_dense_layer) / links.tp + tp_calls * links.latency.tp;
  auto tp_exposed = [&](double comm, double gemms) {
    return options.tp_comm_overlap ? hidden_cost(g, comm, gemms) : comm;
  };
  const double gemms_fwd = af.dense_gemm + mlp_gemm_fwd;
  af.tp += tp_exposed(tp, gemms_fwd);
  ab.tp += tp_exposed(tp, 2 * gemms_fwd);
  // The kernels besides the GEMMs (whose launch gemm() counts): each costs the GPU a launch however little it
  // moves (docs/plan.md, "Kernel launches"). Forward, per block, as Megatron's TransformerEngine path launches them:
  // attention: the input norm, RoPE on queries and on keys, the attention kernel, the fused bias-dropout-add, and
  // the query and key norms (--qk-layernorm) or MLA's two latent norms; MoE: the pre-MLP norm, the router's
  // score and top-k, the load-balancing loss (the scores' sum, the token counts, the loss and its scaler), the
  // dispatcher's token counts, dispatch and combine with their (un)permutation, the activation, the
  // bias-dropout-add; a dense MLP: norm, activation, bias-dropout-add. The backward launches twice the forward's
  // (each op's input gradient, and the norms' weight gradients).
  const double attn_kernels =
      5.0 + (c.multi_latent_attention ? 2.0 : 0.0) + (c.qk_layernorm && !c.multi_latent_attention ? 2.0 : 0.0);
  const double mlp_kernels = !moe_layer ? 3.0
                                        : 1.0 + 2.0 + (aux_loss_on(c) ? 4.0 : 0.0) + 5.0 + 1.0 + 1.0 +
                                              (c.moe_shared_expert_intermediate_size > 0 ? 1.0 : 0.0);
  af.launch += attn_kernels * g.kernel_launch_seconds, ab.launch += 2 * attn_kernels * g.kernel_launch_seconds;
  mf.launch += mlp_kernels * g.kernel_launch_seconds, mb.launch += 2 * mlp_kernels * g.kernel_launch_seconds;
  LayerTimes out;
  out.fwd = af, out.fwd += mf;
  out.bwd = ab, out.bwd += mb;
  out.recompute = full_recompute ? out.fwd : (rc_attn += rc_mlp);
  return out;
}

LayerTimes embedding_times(const TrainConfig& c, const PlanLayout& l, const GpuSpec& g) {
  const Shape s = shape_of(c, l);
  LayerTimes out;
  out.fwd.memory = hbm_seconds(g, 2 * s.T * s.H * s.e);
  out.bwd.memory = 2 * out.fwd.memory;
  out.fwd.launch = g.kernel_launch_seconds, out.bwd.launch = 2 * g.kernel_launch_seconds;  // gather; scatter-add
  return out;
}

LayerTimes loss_times(const TrainConfig& c, int64_t padded_vocab, const PlanLayout& l, const GpuSpec& g,
                      const Links& links, const LayerBytes& bytes, const PlanOptions& options) {
  const Shape s = shape_of(c, l);
  const double V = static_cast<double>(padded_vocab) / s.TP;
  LayerTimes out;
  Gemm output = gemm(c, g, s.T, V, s.H, false);  // the output layer stays in bf16
  if (g.output_layer_fwd_seconds + g.output_layer_bwd_seconds > 0)
    output.fwd = g.output_layer_fwd_seconds, output.bwd = g.output_layer_bwd_seconds;
  add(out.fwd, out.bwd, &OpTimes::dense_gemm, output);
  const double xent = hbm_seconds(g, 3 * s.T * V * 4);  // logits in f32: softmax, loss, its gradient
  const bool measured = g.cross_entropy_fwd_seconds + g.cross_entropy_bwd_seconds > 0;
  out.fwd.memory += (measured ? g.cross_entropy_fwd_seconds : xent) + hbm_seconds(g, 2 * s.Tsp * s.H * s.e);
  out.bwd.memory += measured ? g.cross_entropy_bwd_seconds : xent;
  // The final norm and the cross-entropy's kernels (forward: norm, loss; backward: the loss's gradient, norm).
  out.fwd.launch = 2 * g.kernel_launch_seconds, out.bwd.launch = 2 * g.kernel_launch_seconds;
  // The ends' gather and scatter, and the vocabulary-parallel cross-entropy's three all-reduces (forward).
  const double tp_lat = l.tp > 1 ? links.latency.tp : 0.0;
  const double tp_f = bytes.tp_ends / links.tp + 5 * tp_lat, tp_b = bytes.tp_ends / links.tp + 2 * tp_lat;
  out.fwd.tp += options.tp_comm_overlap ? hidden_cost(g, tp_f, out.fwd.dense_gemm) : tp_f;
  out.bwd.tp += options.tp_comm_overlap ? hidden_cost(g, tp_b, out.bwd.dense_gemm) : tp_b;
  return out;
}

int64_t host_syncs_per_moe_forward(const TrainConfig& c) {
  const bool drop_and_pad = c.moe_pad_expert_input_to_capacity && c.moe_expert_capacity_factor >= 0;
  if (c.moe_token_dispatcher_type == "allgather") return 1;
  if (c.moe_token_dispatcher_type == "flex" && c.moe_flex_dispatcher_backend != "hybridep") return 1;  // DeepEP
  return drop_and_pad ? 0 : 1;
}

double optimizer_seconds(const TrainConfig& c, double params, const GpuSpec& g) {
  // Adam per element: read the gradient (4), read and write the f32 master (8) and both moments (16, or 8 in
  // bf16), write the bf16 parameter (2); the gradient buffer zeroed (4); with --clip-grad the gradient read once
  // more for its norm (4).
  const double moments = c.exp_avg_dtype == "bf16" && c.exp_avg_sq_dtype == "bf16" ? 8.0 : 16.0;
  const double clip = c.clip_grad > 0 ? 4.0 : 0.0;
  const double per = (c.optimizer == "sgd" ? 18.0 : 4 + 8 + moments + 2 + 4) + clip;
  return hbm_seconds(g, params * per);
}

OpTimes& OpTimes::operator+=(const OpTimes& o) {
  dense_gemm += o.dense_gemm, expert_gemm += o.expert_gemm, attention += o.attention, memory += o.memory;
  launch += o.launch;
  tp += o.tp, ep += o.ep, etp += o.etp, cp += o.cp;
  return *this;
}

OpTimes OpTimes::operator*(double f) const {
  OpTimes o = *this;
  o.dense_gemm *= f, o.expert_gemm *= f, o.attention *= f, o.memory *= f, o.launch *= f;
  o.tp *= f, o.ep *= f, o.etp *= f, o.cp *= f;
  return o;
}

}  // namespace moecore::train::plan
