// Router (see router.h). Formulas follow reference §1.1a/§1.1b; every backward term is derived next to its code.
// Top-k breaks ties toward the lower expert index (torch.topk leaves this to the backend).
#include "moecore/moe/router.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "moecore/core/rng.h"
#include "moecore/core/timers.h"
#include "moecore/kernels/elementwise.h"
#include "moecore/kernels/gemm.h"
#include "moecore/moe/sinkhorn.h"
#include "moecore/nn/stash_bytes.h"

namespace moecore::moe {

namespace {

// Per-thread selection scratch, in 8-byte words: selection scores [E] and group scores [G] (router dtype, at most 8
// bytes), the taken and allowed masks [E] (bytes), the top ids inside a group [K] and the selected groups [G] (I32).
struct RowScratch {
  void* sel;
  void* group_scores;
  uint8_t* taken;
  uint8_t* allowed;
  int32_t* inner;
  int32_t* groups;
};

// Groups take scratch only with --moe-router-group-topk (--moe-router-num-groups alone routes over all experts,
// and is then not bounded by them).
int64_t scratch_groups(const RouterConfig& c) {
  return c.group_topk > 0 ? c.num_groups : 1;
}

int64_t scratch_words(const RouterConfig& c) {
  const int64_t E = c.num_experts, G = scratch_groups(c), K = c.topk;
  return E + G + (2 * E + 7) / 8 + (K + G + 1) / 2;
}

RowScratch row_scratch(const RouterConfig& c, int64_t* w) {
  const int64_t E = c.num_experts, G = scratch_groups(c), K = c.topk;
  RowScratch r{};
  r.sel = w;
  r.group_scores = w + E;
  r.taken = reinterpret_cast<uint8_t*>(w + E + G);
  r.allowed = r.taken + E;
  r.inner = reinterpret_cast<int32_t*>(w + E + G + (2 * E + 7) / 8);
  r.groups = r.inner + K;
  return r;
}

}  // namespace

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
  scratch_threads_ = std::max(1, omp_get_max_threads());
  scratch_words_ = scratch_words(cfg);
  scratch_ = Tensor::empty({scratch_threads_, scratch_words_}, DType::I64);
}

namespace {

// Indices of the k largest v[e] among allowed experts, largest first, ties to the lower index.
template <typename T>
void topk_row(const T* v, const uint8_t* allowed, int64_t E, int64_t k, int32_t* idx, uint8_t* taken) {
  std::fill(taken, taken + E, uint8_t{0});
  for (int64_t j = 0; j < k; j++) {
    int64_t best = -1;
    for (int64_t e = 0; e < E; e++) {
      if (taken[e] || (allowed && !allowed[e])) continue;
      if (best < 0 || v[e] > v[best]) best = e;
    }
    MOE_ASSERT(best >= 0);
    taken[best] = 1;
    idx[j] = static_cast<int32_t>(best);
  }
}

// Group-limited top-k (Megatron's group_limited_topk): each group scored by the sum of its top (k // g) values (integer
// division: 0 when k < g, every group then scores 0 and the lower-indexed groups win the tie), the best g groups
// kept, the top k among their experts selected.
template <typename T>
void group_topk_row(const T* v, int64_t E, int64_t k, int64_t G, int64_t g, int32_t* idx, const RowScratch& s) {
  const int64_t n = E / G, per = k / g;
  T* group_scores = static_cast<T*>(s.group_scores);
  for (int64_t grp = 0; grp < G; grp++) {
    topk_row(v + grp * n, nullptr, n, per, s.inner, s.taken);
    T sum = 0;
    for (int64_t j = 0; j < per; j++) sum += v[grp * n + s.inner[j]];
    group_scores[grp] = sum;
  }
  topk_row(group_scores, nullptr, G, g, s.groups, s.taken);
  std::fill(s.allowed, s.allowed + E, uint8_t{0});
  for (int64_t i = 0; i < g; i++) std::fill(s.allowed + s.groups[i] * n, s.allowed + (s.groups[i] + 1) * n, uint8_t{1});
  topk_row(v, s.allowed, E, k, idx, s.taken);
}

// Softmax over n values; out may alias l.
template <typename T>
void softmax_row(const T* l, T* out, int64_t n) {
  T mx = -std::numeric_limits<T>::infinity();
  for (int64_t i = 0; i < n; i++) mx = std::max(mx, l[i]);
  T s = 0;
  for (int64_t i = 0; i < n; i++) s += (out[i] = std::exp(l[i] - mx));
  for (int64_t i = 0; i < n; i++) out[i] /= s;
}

template <typename T>
inline T sigmoid(T x) {
  return T(1) / (T(1) + std::exp(-x));
}

// Aux scores (reference §1.1b compute_routing_scores_for_aux_loss): softmax over E, or sigmoid normalized to sum 1.
template <typename T>
void aux_scores_row(ScoreFunction f, const T* l, T* a, int64_t E) {
  if (f == ScoreFunction::Softmax) {
    softmax_row(l, a, E);
  } else {
    T z = 0;
    for (int64_t e = 0; e < E; e++) z += (a[e] = sigmoid(l[e]));
    z += T(1e-20);
    for (int64_t e = 0; e < E; e++) a[e] /= z;
  }
}

// Scores, top-k and probabilities per token into st.idx_TK / st.p_TK; probs_TK = p · scaling factor, all kept.
template <typename T>
void route_impl(const RouterConfig& c, Router::Stash& st, const T* used_logits, const float* bias,
                const double* sinkhorn_TE, int64_t* scratch, int64_t words, int nthreads, Tensor& probs_TK) {
  const int64_t T_ = st.logits_TE.dim(0), E = c.num_experts, K = c.topk;
  const bool groups = c.group_topk > 0;
  int32_t* idx = st.idx_TK.data<int32_t>();
  T* p = st.p_TK.data<T>();
  T* scores = st.scores_TE.defined() ? st.scores_TE.data<T>() : nullptr;
  _Pragma("omp parallel num_threads(nthreads)") {
    const RowScratch rs = row_scratch(c, scratch + omp_get_thread_num() * words);
    T* sel = static_cast<T*>(rs.sel);
    _Pragma("omp for schedule(static)") for (int64_t t = 0; t < T_; t++) {
      const T* l = used_logits + t * E;
      int32_t* id = idx + t * K;
      T* pr = p + t * K;
      auto select = [&](const T* v) {
        if (sinkhorn_TE)  // training under sinkhorn: the experts come from the balanced cost, the probs from v
          topk_row(sinkhorn_TE + t * E, nullptr, E, K, id, rs.taken);
        else if (groups)
          group_topk_row(v, E, K, c.num_groups, c.group_topk, id, rs);
        else
          topk_row(v, nullptr, E, K, id, rs.taken);
      };
      if (c.score_function == ScoreFunction::Softmax) {
        if (c.pre_softmax) {  // s = softmax(l) over E; p = top-k of s, not renormalized
          T* s = scores + t * E;
          softmax_row(l, s, E);
          select(s);
          for (int64_t j = 0; j < K; j++) pr[j] = s[id[j]];
        } else {  // top-k of the logits, softmax over the k selected
          select(l);
          for (int64_t j = 0; j < K; j++) pr[j] = l[id[j]];
          softmax_row(pr, pr, K);
        }
      } else {  // sigmoid: selection on s + bias, probs from s, renormalized over the k selected when k > 1
        T* s = scores + t * E;
        for (int64_t e = 0; e < E; e++) s[e] = sigmoid(l[e]);
        if (bias) {
          for (int64_t e = 0; e < E; e++) sel[e] = s[e] + static_cast<T>(bias[e]);
          select(sel);
        } else {
          select(s);
        }
        T z = 0;
        for (int64_t j = 0; j < K; j++) z += (pr[j] = s[id[j]]);
        if (K > 1)
          for (int64_t j = 0; j < K; j++) pr[j] /= (z + T(1e-20));
      }
    }
  }
  const T scale = c.topk_scaling_factor > 0 ? T(c.topk_scaling_factor) : T(1);
  T* P = probs_TK.data<T>();
  int32_t* kept = st.kept_TK.data<int32_t>();
  for (int64_t i = 0; i < T_ * K; i++) {
    P[i] = p[i] * scale;
    kept[i] = 1;
  }
}

// Capacity dropping per expert (reference §1.2): each expert keeps C of its assignments, by probability (ties to
// the earlier token) or by position (the earliest). Under padding, Megatron ranks every token as a candidate, the
// unrouted ones at probability 0, so an assignment of probability exactly 0 also competes with the earlier unrouted
// tokens. Returns the number of dropped assignments.
template <typename T>
int64_t apply_capacity(const RouterConfig& c, Router::Stash& st, Tensor& probs_TK, int64_t C) {
  const int64_t T_ = probs_TK.dim(0), E = c.num_experts, K = c.topk, n_all = T_ * K;
  T* P = probs_TK.data<T>();
  const int32_t* idx = st.idx_TK.data<int32_t>();
  int32_t* kept = st.kept_TK.data<int32_t>();
  // Assignments t·K + j grouped by expert, ascending token inside an expert (counting sort).
  Tensor off_t = Tensor::zeros({E + 1}, DType::I64), ent_t = Tensor::empty({std::max<int64_t>(n_all, 1)}, DType::I64);
  int64_t* off = off_t.data<int64_t>();
  int64_t* ent = ent_t.data<int64_t>();
  for (int64_t i = 0; i < n_all; i++) off[idx[i] + 1]++;
  for (int64_t e = 0; e < E; e++) off[e + 1] += off[e];
  for (int64_t i = 0; i < n_all; i++) ent[off[idx[i]]++] = i;  // off[e] ends at the start of e + 1
  for (int64_t e = E; e > 0; e--) off[e] = off[e - 1];
  off[0] = 0;
  int64_t dropped = 0;
  _Pragma("omp parallel for schedule(static) reduction(+ : dropped)") for (int64_t e = 0; e < E; e++) {
    int64_t* seg = ent + off[e];
    const int64_t n = off[e + 1] - off[e];
    auto drop = [&](int64_t i) {
      kept[i] = 0;
      P[i] = 0;
      dropped++;
    };
    if (c.drop_policy == DropPolicy::Position) {  // routed tokens first, earliest first
      for (int64_t i = C; i < n; i++) drop(seg[i]);
      continue;
    }
    int64_t a = 0;  // assignments with a positive probability
    for (int64_t i = 0; i < n; i++) a += P[seg[i]] > 0;
    if (a > C) {  // the C largest probabilities, ties to the earlier token; every zero one is dropped
      std::sort(seg, seg + n, [&](int64_t x, int64_t y) { return P[x] > P[y] || (P[x] == P[y] && x < y); });
      for (int64_t i = C; i < n; i++) drop(seg[i]);
      continue;
    }
    // Every positive one is kept; a zero one ranks after them, in token order among the zero ones (and, under
    // padding, among all tokens without a positive assignment to e).
    int64_t pos_before = 0, zeros_before = 0;
    for (int64_t i = 0; i < n; i++) {
      const int64_t t = seg[i] / K;
      if (P[seg[i]] > 0) {
        pos_before++;
        continue;
      }
      const int64_t rank = a + (c.pad_to_capacity ? t - pos_before : zeros_before);
      zeros_before++;
      if (rank >= C) drop(seg[i]);
    }
  }
  return dropped;
}

}  // namespace

Router::Output Router::forward(const Tensor& x_TH, int64_t S, int64_t B, bool training, Stash& st) {
  // moecore's: the router phase of bench moe-layer's split and of bench train's GPU table (cuda/gpu_profile.h)
  TimerScope timer("moe-router", 2);
  if (x_TH.device().is_cuda()) return forward_cuda(x_TH, S, B, training, st);
  const int64_t T_ = x_TH.rows(), H = cfg_.hidden, E = cfg_.num_experts, K = cfg_.topk;
  MOE_ASSERT(T_ == S * B && x_TH.cols() == H);
  const DType rd = cfg_.router_dtype;
  st.S = S;
  st.B = B;
  // 1. Gating input in router dtype, with multiplicative jitter x ⊙ U(1−ε, 1+ε) when training.
  st.x_r = x_TH.reshape({T_, H}).as_dtype(rd);
  st.jitter_TH = Tensor();
  const NoisePosition noise = noise_position(T_, training, st);
  st.replay.forward_index = noise.forward;
  const bool count = !st.recompute;
  if (training && cfg_.input_jitter_eps > 0) {
    st.jitter_TH = jitter_multipliers(T_, noise);
    st.x_r = st.x_r.clone();
    MOE_DISPATCH_FLOAT(rd, R, {
      const R* u = st.jitter_TH.data<R>();
      R* xr = st.x_r.data<R>();
      for (int64_t i = 0; i < T_ * H; i++) xr[i] *= u[i];
    });
  }
  // 2. logits = x·Wᵀ (+ b) in router dtype.
  gating_forward(st);
  // 3. Forced balance (benchmarks): logits replaced by N(0, 1) noise, straight-through gradient.
  Tensor used = st.logits_TE;
  if (cfg_.force_load_balancing) used = balance_noise(T_, noise);
  st.used_TE = used;
  // 4. Scores, top-k, probs; capacity.
  st.idx_TK = Tensor::empty({T_, K}, DType::I32);
  st.p_TK = Tensor::empty({T_, K}, rd);
  st.kept_TK = Tensor::empty({T_, K}, DType::I32);
  const bool need_scores = cfg_.score_function == ScoreFunction::Sigmoid || cfg_.pre_softmax;
  st.scores_TE = need_scores ? Tensor::empty({T_, E}, rd) : Tensor();
  Output out{Tensor::empty({T_, K}, DType::I32), Tensor::empty({T_, K}, rd), 0};
  const int nthreads = static_cast<int>(std::min<int64_t>(omp_get_max_threads(), scratch_threads_));
  int64_t dropped = 0;
  const Tensor sinkhorn = training && routes_by_sinkhorn(cfg_) ? sinkhorn_TE(used, cfg_.count_group) : Tensor();
  MOE_DISPATCH_FLOAT(rd, R, {
    route_impl<R>(cfg_, st, used.data<R>(), cfg_.enable_expert_bias ? expert_bias_E_.data<float>() : nullptr,
                  sinkhorn.defined() ? sinkhorn.data<double>() : nullptr, scratch_.data<int64_t>(), scratch_words_,
                  nthreads, out.probs_TK);
    if (cfg_.capacity_factor >= 0) {
      int64_t C = expert_capacity(cfg_, T_);
      if (cfg_.pad_to_capacity) out.pad_capacity = C = std::min(C, T_);
      dropped = apply_capacity<R>(cfg_, st, out.probs_TK, C);
    }
  });
  {
    const int32_t* idx = st.idx_TK.data<int32_t>();
    const int32_t* kept = st.kept_TK.data<int32_t>();
    int32_t* id_out = out.idx_TK.data<int32_t>();
    for (int64_t i = 0; i < T_ * K; i++) id_out[i] = kept[i] ? idx[i] : -1;
  }
  st.aux_loss_total = 0;
  st.aux_scores_TE = Tensor();
  st.daux_TE = Tensor();
  st.lse_T = Tensor();
  if (!training) return out;
  // 5. Aux scores (for the losses and the entropy statistic), losses, z-loss.
  st.aux_scores_TE = Tensor::empty({T_, E}, rd);
  double entropy = 0;
  MOE_DISPATCH_FLOAT(rd, R, {
    const R* l = used.data<R>();
    R* a = st.aux_scores_TE.data<R>();
    _Pragma("omp parallel for schedule(static)") for (int64_t t = 0; t < T_; t++)
        aux_scores_row(cfg_.score_function, l + t * E, a + t * E, E);
    for (int64_t i = 0; i < T_ * E; i++)
      if (a[i] > 0) entropy -= static_cast<double>(a[i]) * std::log(static_cast<double>(a[i]));
  });
  bool any_aux = false;
  for (size_t i = 0; i < cfg_.load_balancing.size(); i++)
    any_aux |= cfg_.load_balancing[i] != LoadBalancingType::None && cfg_.aux_loss_coeff[i] > 0;
  if (any_aux) {
    st.daux_TE = Tensor::zeros({T_, E}, rd);
    // Plain top-k on the aux scores (no bias, no groups, no dropping) gives the counts.
    Tensor top_TK = Tensor::empty({T_, K}, DType::I32);
    const RowScratch rs = row_scratch(cfg_, scratch_.data<int64_t>());
    MOE_DISPATCH_FLOAT(rd, R, {
      const R* a = st.aux_scores_TE.data<R>();
      for (int64_t t = 0; t < T_; t++) topk_row(a + t * E, nullptr, E, K, top_TK.data<int32_t>() + t * K, rs.taken);
    });
    st.aux_loss_total += add_aux_losses(top_TK, S, B, count, st);
  }
  if (cfg_.z_loss_coeff > 0) {  // z = coeff · mean_t (logsumexp_e logits_te)², on the real logits
    st.lse_T = Tensor::empty({T_}, rd);
    const double z = z_loss(st.logits_TE, cfg_.z_loss_coeff, count_ranks(), st.lse_T);
    st.aux_loss_total += z;
    if (count) stats_.z_loss_sum += z / cfg_.z_loss_coeff;
  }
  if (!count) return out;
  // Statistics: kept assignments (after dropping, padding rows excluded). Expert-bias counts: the same, except under
  // --moe-pad-expert-input-to-capacity, where Megatron counts its routing map, the padded capacity mask: every
  // expert counts its capacity, so the counts are equal and the bias does not move (followed, not corrected).
  double* cnt = tokens_per_expert_E_.data<double>();
  const int32_t* id_out = out.idx_TK.data<int32_t>();
  for (int64_t i = 0; i < T_ * K; i++)
    if (id_out[i] >= 0) {
      if (!cfg_.pad_to_capacity) cnt[id_out[i]] += 1;
      stats_.tokens_per_expert[static_cast<size_t>(id_out[i])]++;
    }
  if (cfg_.pad_to_capacity)
    for (int64_t e = 0; e < E; e++) cnt[e] += static_cast<double>(out.pad_capacity);
  stats_.assignments += T_ * K;
  stats_.dropped += dropped;
  stats_.entropy_sum += entropy;
  stats_.tokens += T_;
  stats_.micro_batches++;
  return out;
}

namespace {

template <typename T>
void score_backward(const RouterConfig& c, const Router::Stash& st, const T* dP, T* dl) {
  const int64_t T_ = st.idx_TK.dim(0), E = c.num_experts, K = c.topk;
  const int32_t* idx = st.idx_TK.data<int32_t>();
  const int32_t* kept = st.kept_TK.data<int32_t>();
  const T* p = st.p_TK.data<T>();
  const T* s = st.scores_TE.defined() ? st.scores_TE.data<T>() : nullptr;
  const T scale = c.topk_scaling_factor > 0 ? T(c.topk_scaling_factor) : T(1);
  _Pragma("omp parallel for schedule(static)") for (int64_t t = 0; t < T_; t++) {
    const int32_t* id = idx + t * K;
    // g_j: gradient w.r.t. the unscaled selected prob j (dropped assignments carry none).
    auto g = [&](int64_t j) { return kept[t * K + j] ? dP[t * K + j] * scale : T(0); };
    T* d = dl + t * E;
    for (int64_t e = 0; e < E; e++) d[e] = 0;
    if (c.score_function == ScoreFunction::Softmax && !c.pre_softmax) {
      // p = softmax(l_sel):  dl_j = p_j·(g_j − Σ_i p_i·g_i)
      T dot = 0;
      for (int64_t j = 0; j < K; j++) dot += p[t * K + j] * g(j);
      for (int64_t j = 0; j < K; j++) d[id[j]] = p[t * K + j] * (g(j) - dot);
    } else if (c.score_function == ScoreFunction::Softmax) {
      // s = softmax(l) over E, p_j = s_{id_j}:  dl_e = s_e·(ds_e − Σ_i s_i·ds_i), ds nonzero on the selected
      const T* se = s + t * E;
      T dot = 0;
      for (int64_t j = 0; j < K; j++) dot += se[id[j]] * g(j);
      for (int64_t e = 0; e < E; e++) d[e] = -se[e] * dot;
      for (int64_t j = 0; j < K; j++) d[id[j]] += se[id[j]] * g(j);
    } else {
      // s = σ(l); p_j = s_j/Z with Z = Σ_sel s + 1e-20 when K > 1:
      //   ds_i = g_i/Z − (Σ_j g_j·s_j)/Z²;  dl_i = ds_i·s_i·(1 − s_i)
      const T* se = s + t * E;
      T z = 0, gs = 0;
      for (int64_t j = 0; j < K; j++) {
        z += se[id[j]];
        gs += g(j) * se[id[j]];
      }
      z += T(1e-20);
      for (int64_t j = 0; j < K; j++) {
        const T si = se[id[j]];
        const T ds = K > 1 ? g(j) / z - gs / (z * z) : g(j);
        d[id[j]] = ds * si * (T(1) - si);
      }
    }
  }
}

// dL/dl from dL/da through the aux score function (reference §1.1b):
//   softmax:   dl = a ⊙ (da − Σ a·da)
//   sigmoid:   a = σ/Z, Z = Σσ + 1e-20:  dσ_i = da_i/Z − (Σ_j da_j·σ_j)/Z²;  dl = dσ ⊙ σ(1 − σ)
template <typename T>
void aux_score_backward(ScoreFunction f, const T* used_logits, const T* a, const T* da, T* dl, int64_t T_, int64_t E,
                        T scale) {
  _Pragma("omp parallel for schedule(static)") for (int64_t t = 0; t < T_; t++) {
    const T* ar = a + t * E;
    const T* dr = da + t * E;
    T* out = dl + t * E;
    if (f == ScoreFunction::Softmax) {
      T dot = 0;
      for (int64_t e = 0; e < E; e++) dot += ar[e] * dr[e];
      for (int64_t e = 0; e < E; e++) out[e] += scale * ar[e] * (dr[e] - dot);
    } else {
      const T* l = used_logits + t * E;
      T z = 0, dot = 0;
      for (int64_t e = 0; e < E; e++) {
        const T sg = sigmoid(l[e]);
        z += sg;
        dot += dr[e] * sg;
      }
      z += T(1e-20);
      for (int64_t e = 0; e < E; e++) {
        const T sg = sigmoid(l[e]);
        out[e] += scale * (dr[e] / z - dot / (z * z)) * sg * (T(1) - sg);
      }
    }
  }
}

}  // namespace

// Σ over the load-balancing types of grad_scale · L (coefficients included), the per-type statistics counted when
// `count`; each loss's gradient added into st.daux_TE. On either device: aux_losses.h dispatches on a_TE's.
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
  if (st.logits_TE.device().is_cuda()) {
    Tensor dx = backward_cuda(dprobs_TK, x_dtype, aux_grad_scale, st);
    if (dx_add) kernels::add_(*dx_add, dx);
    return dx_add ? Tensor() : dx;
  }
  const int64_t T_ = st.logits_TE.dim(0), E = cfg_.num_experts, H = cfg_.hidden;
  const DType rd = cfg_.router_dtype;
  MOE_ASSERT(dprobs_TK.dtype() == rd && dprobs_TK.numel() == T_ * cfg_.topk);
  Tensor dl = Tensor::empty({T_, E}, rd);
  MOE_DISPATCH_FLOAT(rd, R, {
    R* d = dl.data<R>();
    score_backward<R>(cfg_, st, dprobs_TK.data<R>(), d);
    if (st.daux_TE.defined()) {
      // The aux scores were computed from the logits actually routed on; with forced balance those are noise
      // and the gradient passes straight through to the real logits.
      aux_score_backward<R>(cfg_.score_function, st.used_TE.data<R>(), st.aux_scores_TE.data<R>(), st.daux_TE.data<R>(),
                            d, T_, E, R(aux_grad_scale));
    }
  });
  if (st.lse_T.defined()) z_loss_backward(st.logits_TE, st.lse_T, cfg_.z_loss_coeff, count_ranks(), aux_grad_scale, dl);
  // Gating backward: dx_r = dl·W, dW += dlᵀ·x_r, db += Σ_t dl (in router dtype), then through the jitter:
  // dx = dx_r ⊙ u.
  const Tensor w_r = weight_->value.as_dtype(rd);
  // Into the caller's sum where nothing follows the GEMM (no jitter) and the dtypes agree.
  const bool into = dx_add && !st.jitter_TH.defined() && dx_add->dtype() == rd;
  Tensor dx_r = into ? *dx_add : Tensor::empty({T_, H}, rd);
  kernels::gemm(dl, false, w_r, false, dx_r, 1.0f, into ? 1.0f : 0.0f);
  gating_param_grads(dl, st);
  if (st.jitter_TH.defined()) {
    MOE_DISPATCH_FLOAT(rd, R, {
      R* d = dx_r.data<R>();
      const R* u = st.jitter_TH.data<R>();
      for (int64_t i = 0; i < T_ * H; i++) d[i] *= u[i];
    });
  }
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
    // A GPU bias (router_cuda.cpp) is updated through a host copy of its [E] values.
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
    if (expert_bias_E_.device().is_cuda()) expert_bias_E_.copy_from(bias_host);
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
int64_t router_stash_bytes(const RouterConfig& c, int64_t T, bool training) {
  const DType rd = c.router_dtype;
  const int64_t H = c.hidden, E = c.num_experts, K = c.topk;
  const bool jitter = training && c.input_jitter_eps > 0;
  int64_t b = 0;
  if (jitter || rd != DType::F32) b += nn::tensor_bytes(T * H, rd);            // x_r
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
