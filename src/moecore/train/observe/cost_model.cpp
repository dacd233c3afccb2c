// Step FLOPs and analytic communication volumes (see cost_model.h).
#include "moecore/train/observe/cost_model.h"

#include <algorithm>
#include <vector>

#include "moecore/core/error.h"

namespace moecore::train {

namespace {
// Multi-Latent Attention's forward FLOPs per token (its projections, the latent norms as one multiply per channel,
// and the causal core over qk + rope and v channels), as Megatron counts them.
double mla_forward_flops(const TrainConfig& c) {
  const double H = static_cast<double>(c.hidden_size), N = static_cast<double>(c.num_attention_heads);
  const double qk = static_cast<double>(c.qk_head_dim), rope = static_cast<double>(c.qk_pos_emb_head_dim);
  const double v = static_cast<double>(c.v_head_dim), S = static_cast<double>(c.seq_length);
  const double q_lora = static_cast<double>(c.q_lora_rank), kv_lora = static_cast<double>(c.kv_lora_rank);
  const double q = c.q_lora_rank > 0 ? q_lora * (H + N * (qk + rope) + 1) : H * N * (qk + rope);
  const double kv = kv_lora * (H + N * (qk + v) + 1) + H * rope;
  return 2.0 * (q + kv + N * v * H + S / 2.0 * N * (qk + rope) + S / 2.0 * N * v);
}
}  // namespace

double step_flops(const TrainConfig& c, int64_t padded_vocab) {
  // Per token, forward: 2·(GEMM weights touched) + attention scores and values over the causal half.
  const double H = static_cast<double>(c.hidden_size), D = static_cast<double>(c.kv_channels);
  const double Nq = static_cast<double>(c.num_attention_heads), Nkv = static_cast<double>(c.num_query_groups);
  const double S = static_cast<double>(c.seq_length);
  const double gated = c.swiglu ? 3.0 : 2.0;  // weight matrices per FFN
  const double attn = c.multi_latent_attention ? mla_forward_flops(c)
                                               : 2.0 * H * D * (2 * Nq + 2 * Nkv) + 2.0 * 2.0 * (S / 2.0) * Nq * D;
  const double dense_ffn = 2.0 * gated * H * static_cast<double>(c.ffn_hidden_size);
  double moe_ffn = dense_ffn;
  const std::vector<bool>& is_moe = c.is_moe_layer;
  MOE_ASSERT(std::ssize(is_moe) == c.num_layers);
  if (c.num_experts > 0) {
    const double fe = static_cast<double>(c.moe_ffn_hidden_size);
    moe_ffn = 2.0 * gated * H * fe * static_cast<double>(c.moe_router_topk) +
              2.0 * gated * H * static_cast<double>(c.moe_shared_expert_intermediate_size);
  }
  // MTP: each depth is one more layer with the last layer's FFN, its enorm, hnorm and final norm, eh_proj [H, 2H],
  // and its own logits.
  const double depths = static_cast<double>(c.mtp_num_layers);
  double per_token = 2.0 * H * static_cast<double>(padded_vocab) * (1 + depths);  // logits
  for (bool m : is_moe) per_token += attn + (m ? moe_ffn : dense_ffn);
  if (!is_moe.empty())
    per_token += depths * (attn + (is_moe.back() ? moe_ffn : dense_ffn) + 2.0 * (3.0 * H + 2.0 * H * H));
  return 3.0 * per_token * S * static_cast<double>(c.global_batch_size);  // forward + backward (2x)
}

double num_floating_point_operations(const TrainConfig& c, int64_t padded_vocab) {
  const double batch = static_cast<double>(c.global_batch_size), s = static_cast<double>(c.seq_length);
  const double total_tokens = batch * s, seqlen_squared_sum = batch * s * s;
  const double h = static_cast<double>(c.hidden_size);
  const std::vector<bool>& pattern = c.is_moe_layer;
  MOE_ASSERT(std::ssize(pattern) == c.num_layers && !pattern.empty());
  double num_moe_layers = static_cast<double>(std::count(pattern.begin(), pattern.end(), true));
  const double num_experts_routed_to = c.num_experts > 0 ? static_cast<double>(c.moe_router_topk) : 0;
  const double last_layer_is_moe = pattern.back() ? 1 : 0;
  double num_dense_layers = static_cast<double>(c.num_layers) - num_moe_layers;
  // MTP: one more layer per depth, with the last layer's FFN.
  const double mtp_num_layers = static_cast<double>(c.mtp_num_layers);
  num_moe_layers += last_layer_is_moe * mtp_num_layers;
  num_dense_layers += (1 - last_layer_is_moe) * mtp_num_layers;
  const double num_layers = static_cast<double>(c.num_layers) + mtp_num_layers;
  const double moe_ffn = static_cast<double>(c.moe_ffn_hidden_size);
  const double shared_ffn = static_cast<double>(c.moe_shared_expert_intermediate_size);
  const double fwd_bwd = 3, fma = 2, ffn_expansion = c.swiglu ? 3 : 2;
  double self_attn_term = 0, self_attn_core_term = 0;
  if (c.multi_latent_attention) {  // every term per token, the core's S included
    const double n = static_cast<double>(c.num_attention_heads), qk = static_cast<double>(c.qk_head_dim);
    const double rope = static_cast<double>(c.qk_pos_emb_head_dim), v = static_cast<double>(c.v_head_dim);
    const double q_term =
        c.q_lora_rank > 0 ? static_cast<double>(c.q_lora_rank) * (h + n * (qk + rope) + 1) : h * n * (qk + rope);
    self_attn_term = fwd_bwd * fma *
                     (q_term + static_cast<double>(c.kv_lora_rank) * (h + n * (qk + v) + 1) + h * rope + n * v * h +
                      s * n * (qk + rope) / 2 + s * n * v / 2) *
                     num_layers;
  } else {
    const double q = static_cast<double>(c.kv_channels * c.num_attention_heads);
    const double kv = static_cast<double>(c.kv_channels * c.num_query_groups);
    self_attn_term = fwd_bwd * fma * (h * (q + kv + kv) + q * h) * num_layers;
    self_attn_core_term = fwd_bwd * fma * q / 2 * 2 * num_layers;  // causal half, QK^T and (QK^T)V
  }
  return total_tokens * (fwd_bwd * fma * h *
                             (static_cast<double>(c.ffn_hidden_size) * ffn_expansion * num_dense_layers +
                              moe_ffn * num_experts_routed_to * ffn_expansion * num_moe_layers +
                              shared_ffn * ffn_expansion * num_moe_layers) +
                         self_attn_term + fwd_bwd * fma * mtp_num_layers * (3 * h + 2 * h * h) +
                         fwd_bwd * fma * h * static_cast<double>(padded_vocab) * (mtp_num_layers + 1)) +
         seqlen_squared_sum * self_attn_core_term;
}

std::map<std::string, double> analytic_comm_bytes(const TrainConfig& c, const nn::ParamRegistry& reg,
                                                  const ParallelGroups& g) {
  if (!g.distributed()) return {};
  auto size = [](const std::unique_ptr<comm::ProcessGroup>& p) { return ParallelGroups::size(p); };
  CommSizes z;
  z.tp = size(g.tp), z.dp = g.dp_size, z.ep = size(g.ep), z.etp = size(g.etp), z.edp = size(g.edp);
  z.num_microbatches = c.global_batch_size / (c.micro_batch_size * g.dp_size);
  for (auto& p : reg.all()) {
    const double n = static_cast<double>(p->value.numel());
    const double w = n * static_cast<double>(dtype_size(p->value.dtype()));
    if (p->expert_parallel) {
      z.n_exp += n;
      z.w_exp += w;
    } else {
      z.n_dense += n;
      z.w_dense += w;
      if (!p->tensor_parallel) z.n_rep += n;
    }
  }
  return analytic_comm_bytes(c, z);
}

std::map<std::string, double> analytic_comm_bytes(const TrainConfig& c, const CommSizes& z) {
  std::map<std::string, double> out;
  const double TP = static_cast<double>(z.tp), DP = static_cast<double>(z.dp), EP = static_cast<double>(z.ep),
               ETP = static_cast<double>(z.etp), EDP = static_cast<double>(z.edp);
  const double M = static_cast<double>(z.num_microbatches);
  const double T = static_cast<double>(c.seq_length * c.micro_batch_size);  // tokens of a micro-batch
  const double H = static_cast<double>(c.hidden_size), k = static_cast<double>(c.moe_router_topk);
  const double ab = c.bf16 || c.fp16 ? 2.0 : 4.0;  // dispatched token bytes
  const double xb = z.activation_bytes, gb = z.grad_bytes;
  const double n_dense = z.n_dense, n_rep = z.n_rep, n_exp = z.n_exp, w_dense = z.w_dense, w_exp = z.w_exp;
  const std::vector<bool>& is_moe = c.is_moe_layer;
  MOE_ASSERT(std::ssize(is_moe) == c.num_layers);
  const double Lm = static_cast<double>(std::count(is_moe.begin(), is_moe.end(), true));
  const double Ld = static_cast<double>(c.num_layers) - Lm;
  const bool shared = c.moe_shared_expert_intermediate_size > 0;
  // Tensor/sequence parallel: per micro-batch and direction, the embedding's reduce-scatter, an all-gather and a
  // reduce-scatter around every attention and dense or shared MLP block, the output layer's all-gather; each of a
  // [S·b, H] activation (xb bytes a value: f32 in moecore), of which a rank receives (TP−1)/TP. Vocabulary-parallel
  // cross-entropy all-reduces 3 values per token; replicated parameters' gradients are all-reduced once per step.
  if (TP > 1) {
    const double blocks = 2.0 + 2.0 * (static_cast<double>(c.num_layers) + Ld + (shared ? Lm : 0.0));
    out["tp"] = M * (2.0 * blocks * (TP - 1) / TP * T * H * xb + 2 * (TP - 1) / TP * 3 * T * 4) +
                2 * (TP - 1) / TP * n_rep * gb;
  }
  // Data parallel: ring all-reduce of the gradients (gb bytes a value: f32 in moecore), dense over DP, experts over
  // EDP; under the distributed optimizer their reduce-scatter and the all-gather of the updated parameters as stored
  // (bf16 where so).
  const bool sharded = c.use_distributed_optimizer && (c.optimizer == "adam" || c.optimizer == "sgd");
  auto dp_bytes = [&](double P, double n, double w) {
    return sharded ? (P - 1) / P * (n * gb + w) : 2 * (P - 1) / P * n * gb;
  };
  if (DP > 1) out["dp"] = dp_bytes(DP, n_dense, w_dense);
  if (EDP > 1 && n_exp > 0) out["edp"] = dp_bytes(EDP, n_exp, w_exp);
  // Expert parallel, per micro-batch and MoE layer, with uniform routing: of the T/TP·k rows a rank routes,
  // (EP−1)/EP go to other ranks, as tokens and probabilities, and come back: forward dispatch (ab bytes per value)
  // and combine (xb), backward the same in reverse.
  const double Tl = T / TP, rows = Tl * k;
  if (EP > 1 && Lm > 0) {
    if (c.moe_token_dispatcher_type == "alltoall") {
      out["ep"] = M * Lm * (EP - 1) / EP * rows * (2 * H * (ab + xb) + 2 * 4);
    } else if (c.moe_token_dispatcher_type == "flex") {
      // flex: a token crosses once per other rank holding one of its k experts (k of E uniform: it misses a rank's
      // E/EP experts with probability C(E − E/EP, k) / C(E, k)), each way as alltoall's rows; its assignments'
      // routing (two I32 and the probability) forward and their probability gradients back.
      const double E = static_cast<double>(c.num_experts), n = E / EP;
      double miss = 1;
      for (int64_t i = 0; i < c.moe_router_topk; i++) miss *= std::max(0.0, (E - n - i) / (E - i));
      out["ep"] = M * Lm * Tl * ((EP - 1) * (1 - miss) * 2 * H * (ab + xb) + (EP - 1) / EP * k * 16);
    } else {  // allgather: tokens and [T, K] ids and probabilities (pb bytes each) gathered; outputs, input and
              // probability gradients reduce-scattered
      const double pb = c.moe_router_dtype == "fp64" ? 8.0 : 4.0;
      out["ep"] = M * Lm * (EP - 1) * Tl * (H * ab + k * (4 + pb) + H * xb + H * ab + H * xb + k * pb);
    }
  }
  // Expert tensor parallel: the rows a rank holds after dispatch (T/TP·k on average) are gathered from the other
  // ETP ranks and their partial outputs reduce-scattered back; backward mirrors it (plus probability gradients).
  if (ETP > 1 && Lm > 0) {
    out["etp"] = M * Lm * (ETP - 1) * rows * (H * ab + 4 + H * xb + H * ab + H * xb + 4);
  }
  return out;
}

}  // namespace moecore::train
