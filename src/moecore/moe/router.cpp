// Router (see router.h): the steps of a routing, written once for both devices; the per-token work runs in the
// kernels of kernels/routing.h wherever the input lives (on a GPU in f32: the f64 router dtype and Sinkhorn are
// refused there). What passes through the host, all of it small:
// - the jitter and forced-balance noise, drawn with the router's Philox streams (router_noise.cpp) and copied to the
//   input's device: debugging and benchmark features, [T, H] / [T, E] per training forward;
// - a training forward copies [E + 2] f64 back (kept counts per expert, Σ entropy, Σ lse²) for the expert-bias
//   counts (tokens_per_expert_E_ stays on the host, f64) and the RoutingStats, and per load-balancing loss the
//   [E] (seq_aux_loss: [B·E]) counts and aux-score sums (aux_losses.cpp). Evaluation forwards and the backward make
//   no host copy.
// - the expert bias moves to the input's device on the first forward there; finish_global_batch updates it through a
//   host copy of [E].
#include "moecore/moe/router.h"

#include <algorithm>

#include "moecore/core/rng.h"
#include "moecore/core/timers.h"
#include "moecore/kernels/elementwise.h"
#include "moecore/kernels/gemm.h"
#include "moecore/kernels/routing.h"
#include "moecore/moe/sinkhorn.h"
#include "moecore/nn/stash_bytes.h"

namespace moecore::moe {

Router::Router(nn::ParamRegistry& reg, const std::string& name, const RouterConfig& cfg) : cfg_(cfg) {
  validate(cfg);
  if (routes_by_sinkhorn(cfg_)) {  // Megatron's _sinkhorn_activation
    cfg_.score_function = cfg_.topk == 1 ? ScoreFunction::Sigmoid : ScoreFunction::Softmax;
    cfg_.pre_softmax = cfg_.topk > 1;
  }
  const int64_t E = cfg.num_experts;
  weight_ = &reg.add(name + ".weight", {E, cfg.hidden}, nn::InitRule::normal(cfg.init_std));
  if (cfg.bias) bias_ = &reg.add(name + ".bias", {E}, nn::InitRule::normal(cfg.init_std), /*no_weight_decay=*/true);
  expert_bias_E_ = Tensor::zeros({E}, DType::F32);
  tokens_per_expert_E_ = Tensor::zeros({E}, DType::F64);
  global_aux_.tokens_E = Tensor::zeros({E}, DType::F64);
  jitter_stream_ = stream_id(weight_->name + "#jitter");
  balance_stream_ = stream_id(weight_->name + "#force_balance");
  for (auto* s : {&stats_, &last_stats_}) {
    s->tokens_per_expert.assign(static_cast<size_t>(E), 0);
    for (auto ty : cfg.load_balancing) s->loss_names.push_back(load_balancing_name(ty));
    s->loss_sums.assign(cfg.load_balancing.size(), 0.0);
  }
  rule_.K = cfg_.topk;
  rule_.sigmoid = cfg_.score_function == ScoreFunction::Sigmoid;
  rule_.pre_softmax = cfg_.pre_softmax;
  rule_.num_groups = cfg_.num_groups;
  rule_.group_topk = cfg_.group_topk;
  rule_.scale = cfg_.topk_scaling_factor > 0 ? cfg_.topk_scaling_factor : 1.0;
}

Router::Output Router::forward(const Tensor& x_TH, int64_t S, int64_t B, bool training, Stash& st,
                               const Tensor* kept_TH) {
  // moecore's: the router phase of bench moe-layer's split and of bench train's GPU table (cuda/gpu_profile.h)
  TimerScope timer("moe-router", 2);
  const int64_t T_ = x_TH.rows(), H = cfg_.hidden, E = cfg_.num_experts, K = cfg_.topk;
  MOE_ASSERT(T_ == S * B && x_TH.cols() == H);
  const Device dev = x_TH.device();
  const DType rd = cfg_.router_dtype;
  const bool sinkhorn = training && routes_by_sinkhorn(cfg_);
  kernels::router_check_backend(dev, rd);
  MOE_CHECK(weight_->value.device() == dev,
            "the router weight {} is on {} but its input is on {}: move the model with ParamRegistry::to(Device)",
            weight_->name, weight_->value.device().str(), dev.str());
  st.S = S;
  st.B = B;
  // 1. Gating input in router dtype, with multiplicative jitter x ⊙ U(1−ε, 1+ε) when training.
  st.x_r = x_TH.reshape({T_, H}).as_dtype(rd);
  st.jitter_TH = Tensor();
  const NoisePosition noise = noise_position(T_, training, st);
  st.replay.forward_index = noise.forward;
  const bool count = !st.recompute;
  if (training && cfg_.input_jitter_eps > 0) {
    st.jitter_TH = jitter_multipliers(T_, noise).to(dev);
    st.x_r = st.x_r.clone();
    kernels::router_mul_(st.x_r, st.jitter_TH);
  }
  // 2. logits = x·Wᵀ (+ b) in router dtype; backward's copy of x the bf16 one where given.
  gating_forward(st);
  if (kept_TH && !st.jitter_TH.defined()) {
    MOE_ASSERT(kept_TH->numel() == T_ * H && kept_TH->device() == dev);
    st.x_r = kept_TH->reshape({T_, H});
  }
  // 3. Forced balance (benchmarks): logits replaced by N(0, 1) noise, straight-through gradient.
  st.used_TE = cfg_.force_load_balancing ? balance_noise(T_, noise).to(dev) : st.logits_TE;
  // 4. Scores, top-k, probs (and, training, the aux scores with their top-k, the entropy and the logsumexp) in one
  // op; capacity.
  if (cfg_.enable_expert_bias) expert_bias_E_ = expert_bias_E_.to(dev);
  bool any_aux = false;
  for (size_t i = 0; i < cfg_.load_balancing.size(); i++)
    any_aux |= cfg_.load_balancing[i] != LoadBalancingType::None && cfg_.aux_loss_coeff[i] > 0;
  const bool z = training && cfg_.z_loss_coeff > 0;
  kernels::RouterRows r;
  r.used_TE = st.used_TE;
  if (cfg_.enable_expert_bias) r.bias_E = expert_bias_E_;
  if (sinkhorn) r.sinkhorn_TE = sinkhorn_TE(st.used_TE, cfg_.count_group).to(dev);  // computed on the host
  r.idx_TK = st.idx_TK = Tensor::empty({T_, K}, DType::I32, dev);
  r.p_TK = st.p_TK = Tensor::empty({T_, K}, rd, dev);
  r.kept_TK = st.kept_TK = Tensor::empty({T_, K}, DType::I32, dev);
  if (rule_.sigmoid || rule_.pre_softmax) r.scores_TE = Tensor::empty({T_, E}, rd, dev);
  st.scores_TE = r.scores_TE;
  Output out{Tensor::empty({T_, K}, DType::I32, dev), Tensor::empty({T_, K}, rd, dev), 0};
  r.probs_TK = out.probs_TK;
  // Read back after a training forward: kept counts [E], Σ entropy, Σ lse².
  Tensor counts_E2 = training ? Tensor::zeros({E + 2}, DType::F64, dev) : Tensor();
  if (training) {
    r.aux_scores_TE = Tensor::empty({T_, E}, rd, dev);
    if (any_aux) r.aux_top_TK = Tensor::empty({T_, K}, DType::I32, dev);
    r.sums_2 = counts_E2.slice(E, 2);
  }
  if (z) {
    r.logits_TE = st.logits_TE;
    r.lse_T = Tensor::empty({T_}, rd, dev);
  }
  kernels::router_rows(rule_, r);
  const bool capacity = cfg_.capacity_factor >= 0;
  if (capacity) {
    int64_t C = expert_capacity(cfg_, T_);
    if (cfg_.pad_to_capacity) out.pad_capacity = C = std::min(C, T_);
    kernels::router_capacity(st.idx_TK, out.probs_TK, st.kept_TK, E, C, cfg_.drop_policy == DropPolicy::Position,
                             cfg_.pad_to_capacity);
  }
  kernels::router_mask_ids(st.idx_TK, st.kept_TK, out.idx_TK);
  st.aux_loss_total = 0;
  st.aux_scores_TE = r.aux_scores_TE;
  st.daux_TE = Tensor();
  st.lse_T = r.lse_T;
  if (!training) return out;
  // 5. Counts and sums for the statistics, read back in one copy.
  Tensor counts_E = counts_E2.slice(0, E);
  kernels::router_expert_counts(out.idx_TK, counts_E);
  const Tensor sums_h = counts_E2.to(Device::cpu());
  const double* sm = sums_h.data<double>();
  // 6. Losses: the aux losses from their counts, then the z-loss.
  if (any_aux) {
    st.daux_TE = Tensor::zeros({T_, E}, rd, dev);
    st.aux_loss_total += add_aux_losses(r.aux_top_TK, S, B, count, st);
  }
  if (z) {  // z = coeff · mean_t (logsumexp_e logits_te)², on the real logits
    const double zl = z_loss(sm[E + 1], T_, cfg_.z_loss_coeff, count_ranks());
    st.aux_loss_total += zl;
    if (count) stats_.z_loss_sum += zl / cfg_.z_loss_coeff;
  }
  if (!count) return out;
  // Statistics: kept assignments (after dropping, padding rows excluded). Expert-bias counts: the same, except under
  // --moe-pad-expert-input-to-capacity, where Megatron counts its routing map, the padded capacity mask: every
  // expert counts its capacity, so the counts are equal and the bias does not move (followed, not corrected).
  double* cnt = tokens_per_expert_E_.data<double>();
  int64_t kept_total = 0;
  for (int64_t e = 0; e < E; e++) {
    const int64_t c = static_cast<int64_t>(sm[e]);
    kept_total += c;
    cnt[e] += static_cast<double>(cfg_.pad_to_capacity ? out.pad_capacity : c);
    stats_.tokens_per_expert[static_cast<size_t>(e)] += c;
  }
  stats_.assignments += T_ * K;
  stats_.dropped += T_ * K - kept_total;
  stats_.entropy_sum += sm[E];
  stats_.tokens += T_;
  stats_.micro_batches++;
  return out;
}

// Σ over the load-balancing types of grad_scale · L (coefficients included), the per-type statistics counted when
// `count`; each loss's gradient added into st.daux_TE.
double Router::add_aux_losses(const Tensor& top_TK, int64_t S, int64_t B, bool count, Stash& st) {
  double total = 0;
  for (size_t ty = 0; ty < cfg_.load_balancing.size(); ty++) {
    const double coeff = cfg_.aux_loss_coeff[ty];
    const LoadBalancingType type = cfg_.load_balancing[ty];
    if (type == LoadBalancingType::None || coeff == 0) continue;
    double L = 0, grad_scale = 1.0;
    if (type == LoadBalancingType::AuxLoss) {
      L = aux_loss(st.aux_scores_TE, top_TK, coeff, cfg_.count_group, st.daux_TE);
    } else if (type == LoadBalancingType::SeqAuxLoss) {
      L = seq_aux_loss(st.aux_scores_TE, top_TK, S, B, coeff, cfg_.count_group, st.daux_TE);
    } else {
      grad_scale = cfg_.global_grad_scale;
      // A replay starts from the counts its forward saw (and repeats the count all-reduce), on a copy.
      if (count) st.replay.global_before = {global_aux_.tokens_E.clone(), global_aux_.micro_batches};
      GlobalAuxCounts replayed{count ? Tensor() : st.replay.global_before.tokens_E.clone(),
                               st.replay.global_before.micro_batches};
      L = global_aux_loss(st.aux_scores_TE, top_TK, coeff, cfg_.global_group, grad_scale,
                          count ? global_aux_ : replayed, st.daux_TE);
    }
    if (count) stats_.loss_sums[ty] += L / coeff;
    total += grad_scale * L;
  }
  return total;
}

Tensor Router::backward(const Tensor& dprobs_TK, DType x_dtype, double aux_grad_scale, Stash& st, Tensor* dx_add) {
  TimerScope timer("moe-router", 2);
  const int64_t T_ = st.logits_TE.dim(0), E = cfg_.num_experts, H = cfg_.hidden;
  const DType rd = cfg_.router_dtype;
  const Device dev = st.logits_TE.device();
  MOE_ASSERT(dprobs_TK.dtype() == rd && dprobs_TK.numel() == T_ * cfg_.topk);
  MOE_CHECK(dprobs_TK.device() == dev, "the router's output gradient is on {} but its forward ran on {}",
            dprobs_TK.device().str(), dev.str());
  Tensor dl = Tensor::empty({T_, E}, rd, dev);
  kernels::router_score_backward(rule_, dprobs_TK, st.idx_TK, st.kept_TK, st.p_TK, st.scores_TE, dl);
  // The aux scores were computed from the logits actually routed on; with forced balance those are noise and the
  // gradient passes straight through to the real logits.
  if (st.daux_TE.defined())
    kernels::router_aux_score_backward(rule_.sigmoid, st.used_TE, st.aux_scores_TE, st.daux_TE, aux_grad_scale, dl);
  if (st.lse_T.defined()) z_loss_backward(st.logits_TE, st.lse_T, cfg_.z_loss_coeff, count_ranks(), aux_grad_scale, dl);
  // Gating backward: dx_r = dl·W, dW += dlᵀ·x_r, db += Σ_t dl (in router dtype), then through the jitter:
  // dx = dx_r ⊙ u.
  const Tensor w_r = weight_->value.as_dtype(rd);
  // Into the caller's sum where nothing follows the GEMM (no jitter) and the dtypes agree.
  const bool into = dx_add && !st.jitter_TH.defined() && dx_add->dtype() == rd;
  Tensor dx_r = into ? *dx_add : Tensor::empty({T_, H}, rd, dev);
  kernels::gemm(dl, false, w_r, false, dx_r, 1.0f, into ? 1.0f : 0.0f);
  gating_param_grads(dl, st);
  if (st.jitter_TH.defined()) kernels::router_mul_(dx_r, st.jitter_TH);
  st = Stash{};
  if (into) return {};
  Tensor dx = x_dtype == rd ? dx_r : dx_r.to(x_dtype);
  if (dx_add) kernels::add_(*dx_add, dx);
  return dx_add ? Tensor() : dx;
}

void Router::finish_global_batch() {
  if (cfg_.enable_expert_bias) {
    // The counts of every rank that shares these weights' batch: TP×DP×CP.
    if (cfg_.global_group && cfg_.global_group->size() > 1) cfg_.global_group->all_reduce(tokens_per_expert_E_);
    const int64_t E = cfg_.num_experts;
    const double* c = tokens_per_expert_E_.data<double>();
    // A GPU bias is updated through a host copy of its [E] values.
    Tensor bias_host = expert_bias_E_.to(Device::cpu());
    float* b = bias_host.data<float>();
    double mean = 0;
    for (int64_t e = 0; e < E; e++) mean += c[e];
    mean /= static_cast<double>(E);
    for (int64_t e = 0; e < E; e++) {
      const double off = mean - c[e];
      const double sign = off > 0 ? 1.0 : (off < 0 ? -1.0 : 0.0);
      b[e] = static_cast<float>(b[e] + sign * cfg_.bias_update_rate);
    }
    expert_bias_E_.copy_from(bias_host);  // nothing to copy where the bias is on the host already
  }
  last_stats_.copy_values(stats_);
  stats_.reset();
  reset_counters();
}

void Router::reset_counters() {
  tokens_per_expert_E_.zero_();
  global_aux_.tokens_E.zero_();
  global_aux_.micro_batches = 0;
}

// What Router::forward leaves in its Stash (nn/stash_bytes.h); the gating input is the caller's unless converted
// to the router dtype or jittered.
int64_t router_stash_bytes(const RouterConfig& c, int64_t T, bool training, LowPrecision low) {
  const DType rd = c.router_dtype;
  const int64_t H = c.hidden, E = c.num_experts, K = c.topk;
  const bool jitter = training && c.input_jitter_eps > 0;
  int64_t b = 0;
  // x_r: its own when jittered or converted (under --bf16 without jitter the MoE layer's bf16 tokens, counted there).
  if (jitter || (rd != DType::F32 && !low)) b += nn::tensor_bytes(T * H, rd);
  if (jitter) b += nn::tensor_bytes(T * H, rd);                                // jitter_TH
  b += nn::tensor_bytes(T * E, rd) * (c.force_load_balancing ? 2 : 1);         // logits_TE (used_TE: its noise)
  b += 2 * nn::tensor_bytes(T * K, DType::I32) + nn::tensor_bytes(T * K, rd);  // idx_TK, kept_TK, p_TK
  if (c.score_function == ScoreFunction::Sigmoid || c.pre_softmax) b += nn::tensor_bytes(T * E, rd);  // scores_TE
  if (!training) return b;
  b += nn::tensor_bytes(T * E, rd);  // aux_scores_TE
  bool any_aux = false, global = false;
  for (size_t i = 0; i < c.load_balancing.size(); i++) {
    const bool on = c.load_balancing[i] != LoadBalancingType::None && c.aux_loss_coeff[i] > 0;
    any_aux |= on;
    global |= on && c.load_balancing[i] == LoadBalancingType::GlobalAuxLoss;
  }
  if (any_aux) b += nn::tensor_bytes(T * E, rd);         // daux_TE
  if (global) b += nn::tensor_bytes(E, DType::F64);      // replay.global_before
  if (c.z_loss_coeff > 0) b += nn::tensor_bytes(T, rd);  // lse_T
  return b;
}

}  // namespace moecore::moe
