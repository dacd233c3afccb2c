// The Router on the GPU (see router.h): Router::forward / backward route here when the input is a CUDA tensor.
// Same semantics as the CPU path (router.cpp), computed in f32 (f64 router dtype is refused on the GPU); the
// per-token work is one fused kernel (kernels/cuda/router.cu), capacity one block per expert (router_capacity.cu).
// What still goes through the host, all of it small:
// - jitter and forced-balance noise are drawn on the host with the CPU's Philox streams (the same bits) and copied
//   to the GPU: debugging and benchmark features, [T, H] / [T, E] per training forward;
// - a training forward copies [E + 2] f64 back (kept counts per expert, Σ entropy, Σ lse²) for the expert-bias
//   counts (tokens_per_expert_E_ stays on the host, f64) and the RoutingStats, and per load-balancing loss the
//   [E] (seq_aux_loss: [B·E]) counts and aux-score sums, reduced over count_group / global_group on the host
//   (host-staged MPI, as the vocab-parallel cross-entropy does); the loss is formed in f64 on the host and the
//   [E] (or [B·E]) gradient coefficients go back. Evaluation forwards and the backward make no host copy.
// - the expert bias lives on the GPU once a GPU forward has run (moved there lazily); finish_global_batch updates
//   it through a host copy of [E].
// Sinkhorn routing in training is refused (is not supported by moecore on the GPU).
#include "moecore/moe/router.h"

#ifdef MOECORE_HAVE_CUDA

#include <limits>

#include "moecore/device/check.h"
#include "moecore/device/stream.h"
#include "moecore/kernels/cuda/launch_router.h"
#include "moecore/kernels/elementwise.h"
#include "moecore/kernels/gemm.h"
#include "moecore/moe/aux_losses.h"

namespace moecore::moe {

using moecore::cuda::current_stream;

namespace {

float* f32p(const Tensor& t) {
  return t.defined() ? t.device_data<float>() : nullptr;
}
int32_t* i32p(const Tensor& t) {
  return t.defined() ? t.device_data<int32_t>() : nullptr;
}
double* f64p(const Tensor& t) {
  return t.defined() ? t.device_data<double>() : nullptr;
}

// Per-class counts and aux-score sums of the top-k of the aux scores (classes: t mod G), on the host, the counts
// summed over `group`.
void class_stats(const Tensor& a_TE, const Tensor& top_TK, int64_t G, const comm::ProcessGroup* group, Tensor& cnt,
                 Tensor& agg) {
  const int64_t T = a_TE.dim(0), E = a_TE.dim(1), K = top_TK.dim(1);
  Tensor cnt_d = Tensor::empty({G * E}, DType::F64, a_TE.device());
  Tensor agg_d = Tensor::empty({G * E}, DType::F64, a_TE.device());
  launch::router_aux_counts(f32p(a_TE), i32p(top_TK), T, E, K, G, f64p(cnt_d), f64p(agg_d), current_stream());
  MOE_CUDA_CHECK_LAUNCH("router_aux_counts");
  cnt = cnt_d.to(Device::cpu());
  agg = agg_d.to(Device::cpu());
  if (group && group->size() > 1) group->all_reduce(cnt);
}

// da_TE[t, e] += coef[(t mod G)·E + e], coef given on the host (f32, rounded there as the CPU rounds it).
void add_coef(Tensor& da_TE, const Tensor& coef_h, int64_t G) {
  const Tensor coef = coef_h.to(da_TE.device());
  launch::router_add_class_coef(f32p(da_TE), f32p(coef), da_TE.dim(0), da_TE.dim(1), G, current_stream());
  MOE_CUDA_CHECK_LAUNCH("router_add_class_coef");
}

}  // namespace

// The load-balancing losses of aux_losses.h with a_TE, top_TK and da_TE on the GPU: the same formulas, formed on the
// host from the per-class counts and sums (f64).
double aux_loss_gpu(const Tensor& a_TE, const Tensor& top_TK, double coeff, const comm::ProcessGroup* count_group,
                    Tensor& da_TE) {
  const int64_t T = a_TE.dim(0), E = a_TE.dim(1), K = top_TK.dim(1);
  Tensor cnt, agg;
  class_stats(a_TE, top_TK, 1, count_group, cnt, agg);
  const double Tt = static_cast<double>(T * group_size(count_group));
  const double f = coeff * E / (K * Tt * Tt);
  const double* c = cnt.data<double>();
  const double* s = agg.data<double>();
  double L = 0;
  for (int64_t e = 0; e < E; e++) L += s[e] * c[e] * f;
  Tensor coef = Tensor::empty({E}, DType::F32);
  for (int64_t e = 0; e < E; e++) coef.data<float>()[e] = static_cast<float>(f * c[e]);
  add_coef(da_TE, coef, 1);
  return L;
}

double seq_aux_loss_gpu(const Tensor& a_TE, const Tensor& top_TK, int64_t S, int64_t B, double coeff,
                        const comm::ProcessGroup* count_group, Tensor& da_TE) {
  const int64_t E = a_TE.dim(1), K = top_TK.dim(1);
  Tensor cnt, agg;
  class_stats(a_TE, top_TK, B, count_group, cnt, agg);
  const double St = static_cast<double>(S * group_size(count_group));
  const double f = coeff * E / (K * St * St * B);
  const double* c = cnt.data<double>();
  const double* s = agg.data<double>();
  double L = 0;
  for (int64_t i = 0; i < B * E; i++) L += s[i] * c[i] * f;
  Tensor coef = Tensor::empty({B * E}, DType::F32);
  for (int64_t i = 0; i < B * E; i++) coef.data<float>()[i] = static_cast<float>(f * c[i]);
  add_coef(da_TE, coef, B);
  return L;
}

double global_aux_loss_gpu(const Tensor& a_TE, const Tensor& top_TK, double coeff,
                           const comm::ProcessGroup* global_group, double grad_scale, GlobalAuxCounts& acc,
                           Tensor& da_TE) {
  const int64_t T = a_TE.dim(0), E = a_TE.dim(1), K = top_TK.dim(1);
  MOE_ASSERT(acc.tokens_E.numel() == E && acc.tokens_E.dtype() == DType::F64 && !acc.tokens_E.device().is_cuda());
  Tensor cnt, agg;
  class_stats(a_TE, top_TK, 1, global_group, cnt, agg);
  double* c = cnt.data<double>();
  double* g = acc.tokens_E.data<double>();
  acc.micro_batches++;
  for (int64_t e = 0; e < E; e++) {
    g[e] += c[e];
    c[e] = g[e] / static_cast<double>(acc.micro_batches);
  }
  const double Tt = static_cast<double>(T * group_size(global_group));
  const double f = coeff * E / (K * Tt * Tt);
  const double* s = agg.data<double>();
  double L = 0;
  for (int64_t e = 0; e < E; e++) L += s[e] * c[e] * f;
  Tensor coef = Tensor::empty({E}, DType::F32);
  for (int64_t e = 0; e < E; e++) coef.data<float>()[e] = static_cast<float>(grad_scale * f * c[e]);
  add_coef(da_TE, coef, 1);
  return L;
}

Router::Output Router::forward_cuda(const Tensor& x_TH, int64_t S, int64_t B, bool training, Stash& st) {
  const int64_t T_ = x_TH.rows(), H = cfg_.hidden, E = cfg_.num_experts, K = cfg_.topk;
  MOE_ASSERT(T_ == S * B && x_TH.cols() == H);
  const Device dev = x_TH.device();
  const DType rd = cfg_.router_dtype;
  MOE_CHECK(rd == DType::F32,
            "--moe-router-dtype fp64 is not supported by moecore on the GPU (the GPU router computes in f32; "
            "route in fp64 on the CPU)");
  MOE_CHECK(!(training && routes_by_sinkhorn(cfg_)),
            "--moe-router-load-balancing-type sinkhorn is not supported by moecore on the GPU (train on the CPU, "
            "or choose aux_loss, seq_aux_loss, global_aux_loss or none)");
  MOE_CHECK(weight_->value.device() == dev,
            "the router weight {} is on {} but its input is on {}: move the model with ParamRegistry::to(Device)",
            weight_->name, weight_->value.device().str(), dev.str());
  MOE_CHECK(T_ * K < std::numeric_limits<int32_t>::max() && T_ * E < std::numeric_limits<int32_t>::max(),
            "the GPU router indexes assignments with I32: {} tokens × {} experts is too many", T_, E);
  const cudaStream_t stream = current_stream();
  st.S = S;
  st.B = B;
  // 1. Gating input in router dtype, with multiplicative jitter x ⊙ U(1−ε, 1+ε) (drawn on the host) when training.
  st.x_r = x_TH.reshape({T_, H}).as_dtype(rd);
  st.jitter_TH = Tensor();
  const NoisePosition noise = noise_position(T_, training, st);
  st.replay.forward_index = noise.forward;
  const bool count = !st.recompute;
  if (training && cfg_.input_jitter_eps > 0) {
    st.jitter_TH = jitter_multipliers(T_, noise).to(dev);
    st.x_r = st.x_r.clone();
    launch::router_mul(f32p(st.x_r), f32p(st.jitter_TH), T_ * H, stream);
    MOE_CUDA_CHECK_LAUNCH("router_mul");
  }
  // 2. logits = x·Wᵀ (+ b) (kernels::gemm runs on the GPU for GPU tensors).
  gating_forward(st);
  // 3. Forced balance: N(0, 1) noise drawn on the host, straight-through gradient.
  Tensor used = st.logits_TE;
  if (cfg_.force_load_balancing) used = balance_noise(T_, noise).to(dev);
  st.used_TE = used;
  // 4. Scores, top-k, probs (and, training, aux scores, their top-k, entropy, lse) in one kernel; capacity.
  st.idx_TK = Tensor::empty({T_, K}, DType::I32, dev);
  st.p_TK = Tensor::empty({T_, K}, rd, dev);
  st.kept_TK = Tensor::empty({T_, K}, DType::I32, dev);
  const bool need_scores = cfg_.score_function == ScoreFunction::Sigmoid || cfg_.pre_softmax;
  st.scores_TE = need_scores ? Tensor::empty({T_, E}, rd, dev) : Tensor();
  Output out{Tensor::empty({T_, K}, DType::I32, dev), Tensor::empty({T_, K}, rd, dev), 0};
  st.aux_loss_total = 0;
  st.aux_scores_TE = Tensor();
  st.daux_TE = Tensor();
  st.lse_T = Tensor();
  const bool z = training && cfg_.z_loss_coeff > 0;
  // Read back after a training forward: kept counts [E], Σ entropy, Σ lse².
  Tensor small = training ? Tensor::zeros({E + 2}, DType::F64, dev) : Tensor();
  Tensor entropy_T, lse_sq_T, top_TK, group_scores, group_sel;
  if (cfg_.enable_expert_bias && !expert_bias_E_.device().is_cuda()) expert_bias_E_ = expert_bias_E_.to(dev);
  launch::RouterRowArgs a;
  a.T = T_;
  a.E = E;
  a.K = K;
  a.sigmoid = cfg_.score_function == ScoreFunction::Sigmoid;
  a.pre_softmax = cfg_.pre_softmax;
  a.num_groups = cfg_.num_groups;
  a.group_topk = cfg_.group_topk;
  a.scale = cfg_.topk_scaling_factor > 0 ? static_cast<float>(cfg_.topk_scaling_factor) : 1.0f;
  a.used = f32p(used);
  a.bias = cfg_.enable_expert_bias ? f32p(expert_bias_E_) : nullptr;
  a.scores = f32p(st.scores_TE);
  a.idx = i32p(st.idx_TK);
  a.p = f32p(st.p_TK);
  a.probs = f32p(out.probs_TK);
  a.kept = i32p(st.kept_TK);
  if (cfg_.group_topk > 0) {
    group_scores = Tensor::empty({T_, cfg_.num_groups}, DType::F32, dev);
    group_sel = Tensor::empty({T_, cfg_.num_groups}, DType::I32, dev);
    a.group_scores = f32p(group_scores);
    a.group_sel = i32p(group_sel);
  }
  if (training) {
    st.aux_scores_TE = Tensor::empty({T_, E}, rd, dev);
    top_TK = Tensor::empty({T_, K}, DType::I32, dev);
    entropy_T = Tensor::empty({T_}, DType::F64, dev);
    a.aux_scores = f32p(st.aux_scores_TE);
    a.aux_top = i32p(top_TK);
    a.entropy_T = f64p(entropy_T);
  }
  if (z) {
    st.lse_T = Tensor::empty({T_}, rd, dev);
    lse_sq_T = Tensor::empty({T_}, DType::F64, dev);
    a.logits = f32p(st.logits_TE);
    a.lse = f32p(st.lse_T);
    a.lse_sq_T = f64p(lse_sq_T);
  }
  launch::router_rows(a, stream);
  MOE_CUDA_CHECK_LAUNCH("router_rows");
  const bool capacity = cfg_.capacity_factor >= 0;
  if (capacity) {
    int64_t C = expert_capacity(cfg_, T_);
    if (cfg_.pad_to_capacity) out.pad_capacity = C = std::min(C, T_);
    Tensor list = Tensor::empty({E, T_}, DType::I32, dev), work = Tensor::empty({E, T_}, DType::I32, dev);
    launch::router_capacity(i32p(st.idx_TK), f32p(out.probs_TK), i32p(st.kept_TK), T_, E, K, C,
                            cfg_.drop_policy == DropPolicy::Position, cfg_.pad_to_capacity, i32p(list), i32p(work),
                            stream);
    MOE_CUDA_CHECK_LAUNCH("router_capacity");
  }
  launch::router_mask_ids(i32p(st.idx_TK), i32p(st.kept_TK), i32p(out.idx_TK), T_ * K, stream);
  MOE_CUDA_CHECK_LAUNCH("router_mask_ids");
  if (!training) return out;
  // 5. Counts and sums for the statistics, read back in one copy.
  launch::router_expert_counts(i32p(out.idx_TK), T_ * K, E, f64p(small), stream);
  MOE_CUDA_CHECK_LAUNCH("router_expert_counts");
  launch::router_sum_f64(f64p(entropy_T), T_, f64p(small) + E, stream);
  MOE_CUDA_CHECK_LAUNCH("router_sum_f64");
  if (z) {
    launch::router_sum_f64(f64p(lse_sq_T), T_, f64p(small) + E + 1, stream);
    MOE_CUDA_CHECK_LAUNCH("router_sum_f64");
  }
  const Tensor small_h = small.to(Device::cpu());
  const double* sm = small_h.data<double>();
  // 6. Losses: the aux losses from their counts, then the z-loss.
  bool any_aux = false;
  for (size_t i = 0; i < cfg_.load_balancing.size(); i++)
    any_aux |= cfg_.load_balancing[i] != LoadBalancingType::None && cfg_.aux_loss_coeff[i] > 0;
  if (any_aux) {
    st.daux_TE = Tensor::zeros({T_, E}, rd, dev);
    st.aux_loss_total += add_aux_losses(top_TK, S, B, count, st);
  }
  if (z) {  // z = coeff/(T·ranks) · Σ_t lse_t² (aux_losses.h z_loss)
    const double zl = cfg_.z_loss_coeff * sm[E + 1] / static_cast<double>(T_ * count_ranks());
    st.aux_loss_total += zl;
    if (count) stats_.z_loss_sum += zl / cfg_.z_loss_coeff;
  }
  if (!count) return out;
  // Statistics and expert-bias counts, as router.cpp (padding: every expert counts its capacity).
  double* cnt = tokens_per_expert_E_.data<double>();
  int64_t kept_total = 0;
  for (int64_t e = 0; e < E; e++) {
    const int64_t c = static_cast<int64_t>(sm[e]);
    kept_total += c;
    if (!cfg_.pad_to_capacity) cnt[e] += static_cast<double>(c);
    stats_.tokens_per_expert[static_cast<size_t>(e)] += c;
  }
  if (cfg_.pad_to_capacity)
    for (int64_t e = 0; e < E; e++) cnt[e] += static_cast<double>(out.pad_capacity);
  stats_.assignments += T_ * K;
  stats_.dropped += capacity ? T_ * K - kept_total : 0;
  stats_.entropy_sum += sm[E];
  stats_.tokens += T_;
  stats_.micro_batches++;
  return out;
}

Tensor Router::backward_cuda(const Tensor& dprobs_TK, DType x_dtype, double aux_grad_scale, Stash& st) {
  const int64_t T_ = st.logits_TE.dim(0), E = cfg_.num_experts, H = cfg_.hidden, K = cfg_.topk;
  const DType rd = cfg_.router_dtype;
  MOE_ASSERT(dprobs_TK.dtype() == rd && dprobs_TK.numel() == T_ * K);
  const Device dev = st.logits_TE.device();
  MOE_CHECK(dprobs_TK.device() == dev, "the router's output gradient is on {} but its forward ran on {}",
            dprobs_TK.device().str(), dev.str());
  const cudaStream_t stream = current_stream();
  Tensor dl = Tensor::empty({T_, E}, rd, dev);
  const bool sigmoid = cfg_.score_function == ScoreFunction::Sigmoid;
  const float scale = cfg_.topk_scaling_factor > 0 ? static_cast<float>(cfg_.topk_scaling_factor) : 1.0f;
  launch::router_score_backward(f32p(dprobs_TK), i32p(st.idx_TK), i32p(st.kept_TK), f32p(st.p_TK), f32p(st.scores_TE),
                                sigmoid, cfg_.pre_softmax, scale, T_, E, K, f32p(dl), stream);
  MOE_CUDA_CHECK_LAUNCH("router_score_backward");
  if (st.daux_TE.defined()) {  // through the aux scores of the logits routed on (straight through under forced balance)
    launch::router_aux_score_backward(sigmoid, f32p(st.used_TE), f32p(st.aux_scores_TE), f32p(st.daux_TE), f32p(dl), T_,
                                      E, static_cast<float>(aux_grad_scale), stream);
    MOE_CUDA_CHECK_LAUNCH("router_aux_score_backward");
  }
  if (st.lse_T.defined()) {  // dz/dl_te = coeff · 2·lse_t/(T·ranks) · softmax(l_t)_e, times the grad scale
    const float f =
        static_cast<float>(aux_grad_scale * cfg_.z_loss_coeff * 2.0 / static_cast<double>(T_ * count_ranks()));
    launch::router_z_loss_backward(f32p(st.logits_TE), f32p(st.lse_T), f, T_, E, f32p(dl), stream);
    MOE_CUDA_CHECK_LAUNCH("router_z_loss_backward");
  }
  // Gating backward: dx_r = dl·W, dW += dlᵀ·x_r, db += Σ_t dl, then through the jitter: dx = dx_r ⊙ u.
  const Tensor w_r = weight_->value.as_dtype(rd);
  Tensor dx_r = Tensor::empty({T_, H}, rd, dev);
  kernels::gemm(dl, false, w_r, false, dx_r);
  gating_param_grads(dl, st);
  if (st.jitter_TH.defined()) {
    launch::router_mul(f32p(dx_r), f32p(st.jitter_TH), T_ * H, stream);
    MOE_CUDA_CHECK_LAUNCH("router_mul");
  }
  st = Stash{};
  return x_dtype == rd ? dx_r : dx_r.to(x_dtype);
}

}  // namespace moecore::moe

#endif  // MOECORE_HAVE_CUDA
