// Router (see router.h). Formulas follow reference §1.1a/§1.1b; every backward term is derived next to its code.
// Top-k breaks ties toward the lower expert index (torch.topk leaves this to the backend).
#include "moecore/moe/router.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "moecore/core/rng.h"
#include "moecore/kernels/cpu/elementwise.h"
#include "moecore/kernels/cpu/gemm.h"

namespace moecore::moe {

ScoreFunction parse_score_function(const std::string& s) {
  if (s == "softmax") return ScoreFunction::Softmax;
  if (s == "sigmoid") return ScoreFunction::Sigmoid;
  MOE_CHECK(false, "--moe-router-score-function {} is not supported; choose softmax or sigmoid", s);
  return ScoreFunction::Softmax;
}

LoadBalancingType parse_load_balancing_type(const std::string& s) {
  if (s == "aux_loss") return LoadBalancingType::AuxLoss;
  if (s == "seq_aux_loss") return LoadBalancingType::SeqAuxLoss;
  if (s == "global_aux_loss") return LoadBalancingType::GlobalAuxLoss;
  if (s == "none") return LoadBalancingType::None;
  MOE_CHECK(false,
            "--moe-router-load-balancing-type {} is not supported; choose from aux_loss, seq_aux_loss, "
            "global_aux_loss, none (sinkhorn and quantile_balancing are rejected: not available)",
            s);
  return LoadBalancingType::None;
}

DropPolicy parse_drop_policy(const std::string& s) {
  if (s == "probs") return DropPolicy::Probs;
  if (s == "position") return DropPolicy::Position;
  MOE_CHECK(false, "--moe-token-drop-policy {} is not supported; choose probs or position", s);
  return DropPolicy::Probs;
}

const char* load_balancing_name(LoadBalancingType t) {
  switch (t) {
    case LoadBalancingType::AuxLoss: return "load_balancing_loss";
    case LoadBalancingType::SeqAuxLoss: return "seq_load_balancing_loss";
    case LoadBalancingType::GlobalAuxLoss: return "global_load_balancing_loss";
    case LoadBalancingType::None: return "none";
  }
  return "?";
}

void validate(const RouterConfig& c) {
  MOE_CHECK(c.num_experts > 0, "--num-experts must be positive, got {}", c.num_experts);
  MOE_CHECK(c.topk >= 1 && c.topk <= c.num_experts, "--moe-router-topk {} must be in [1, --num-experts={}]", c.topk,
            c.num_experts);
  MOE_CHECK(!(c.topk == 1 && c.score_function == ScoreFunction::Softmax && !c.pre_softmax),
            "--moe-router-topk 1 with the softmax score function needs --moe-router-pre-softmax (a softmax over one "
            "selected logit is constant, so the router would get no gradient)");
  MOE_CHECK(c.router_dtype == DType::F32 || c.router_dtype == DType::F64,
            "--moe-router-dtype must be fp32 or fp64");
  if (c.num_groups > 0 || c.group_topk > 0) {
    MOE_CHECK(c.num_groups > 0 && c.group_topk > 0,
              "--moe-router-num-groups and --moe-router-group-topk must be set together (got {} and {})",
              c.num_groups, c.group_topk);
    MOE_CHECK(c.num_experts % c.num_groups == 0, "--num-experts {} must be divisible by --moe-router-num-groups {}",
              c.num_experts, c.num_groups);
    MOE_CHECK(c.group_topk <= c.num_groups, "--moe-router-group-topk {} exceeds --moe-router-num-groups {}",
              c.group_topk, c.num_groups);
    MOE_CHECK(c.topk % c.group_topk == 0,
              "--moe-router-topk {} must be a multiple of --moe-router-group-topk {} (each group contributes "
              "topk/group_topk experts to its score)",
              c.topk, c.group_topk);
    MOE_CHECK(c.topk / c.group_topk <= c.num_experts / c.num_groups,
              "--moe-router-topk/--moe-router-group-topk = {} exceeds the {} experts per group", c.topk / c.group_topk,
              c.num_experts / c.num_groups);
  }
  MOE_CHECK(!c.enable_expert_bias || c.score_function == ScoreFunction::Sigmoid,
            "--moe-router-enable-expert-bias requires --moe-router-score-function sigmoid");
  MOE_CHECK(c.bias_update_rate >= 0, "--moe-router-bias-update-rate must be >= 0, got {}", c.bias_update_rate);
  MOE_CHECK(c.load_balancing.size() == c.aux_loss_coeff.size(),
            "--moe-aux-loss-coeff needs one coefficient per --moe-router-load-balancing-type ({} types, {} "
            "coefficients)",
            c.load_balancing.size(), c.aux_loss_coeff.size());
  for (size_t i = 0; i < c.load_balancing.size(); i++) {
    MOE_CHECK(c.aux_loss_coeff[i] >= 0, "--moe-aux-loss-coeff must be >= 0, got {}", c.aux_loss_coeff[i]);
    for (size_t j = 0; j < i; j++)
      MOE_CHECK(c.load_balancing[i] != c.load_balancing[j], "--moe-router-load-balancing-type lists {} twice",
                load_balancing_name(c.load_balancing[i]));
  }
  MOE_CHECK(c.z_loss_coeff >= 0, "--moe-z-loss-coeff must be >= 0, got {}", c.z_loss_coeff);
  MOE_CHECK(c.input_jitter_eps >= 0 && c.input_jitter_eps < 1, "--moe-input-jitter-eps must be in [0, 1), got {}",
            c.input_jitter_eps);
  MOE_CHECK(!c.pad_to_capacity || c.capacity_factor >= 0,
            "--moe-pad-expert-input-to-capacity needs --moe-expert-capacity-factor");
  MOE_CHECK(c.topk_scaling_factor >= 0, "--moe-router-topk-scaling-factor must be positive, got {}",
            c.topk_scaling_factor);
}

int64_t expert_capacity(const RouterConfig& c, int64_t T) {
  return static_cast<int64_t>(
      std::ceil(static_cast<double>(c.topk) * static_cast<double>(T) / static_cast<double>(c.num_experts) *
                c.capacity_factor));
}

Router::Router(nn::ParamRegistry& reg, const std::string& name, const RouterConfig& cfg) : cfg_(cfg) {
  validate(cfg);
  weight_ = &reg.add(name + ".weight", {cfg.num_experts, cfg.hidden}, nn::InitRule::normal(cfg.init_std));
  expert_bias_E_ = Tensor::zeros({cfg.num_experts}, DType::F32);
  tokens_per_expert_E_ = Tensor::zeros({cfg.num_experts}, DType::F64);
  global_tokens_E_ = Tensor::zeros({cfg.num_experts}, DType::F64);
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

// Group-limited top-k: groups scored by the sum of their top (k/g) values, the best g groups kept.
template <typename T>
void group_topk_row(const T* v, int64_t E, int64_t k, int64_t G, int64_t g, int32_t* idx, uint8_t* allowed,
                    uint8_t* taken, T* group_scores) {
  const int64_t n = E / G, per = k / g;
  int32_t inner[64];
  MOE_ASSERT(per <= 64);
  for (int64_t grp = 0; grp < G; grp++) {
    topk_row(v + grp * n, nullptr, n, per, inner, taken);
    T s = 0;
    for (int64_t j = 0; j < per; j++) s += v[grp * n + inner[j]];
    group_scores[grp] = s;
  }
  std::vector<int32_t> gsel(static_cast<size_t>(g));
  topk_row(group_scores, nullptr, G, g, gsel.data(), taken);
  std::fill(allowed, allowed + E, uint8_t{0});
  for (int32_t grp : gsel) std::fill(allowed + grp * n, allowed + (grp + 1) * n, uint8_t{1});
  topk_row(v, allowed, E, k, idx, taken);
}

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

struct Scratch {
  std::vector<uint8_t> taken, allowed;
  std::vector<double> group_scores;
};

template <typename T>
void route_impl(const RouterConfig& c, Router::Stash& st, const T* used_logits, const float* bias, Tensor& probs_TE,
                Tensor& map_TE) {
  const int64_t T_ = st.logits_TE.dim(0), E = c.num_experts, K = c.topk;
  const bool groups = c.num_groups > 0;
  int32_t* idx = st.idx_TK.data<int32_t>();
  T* p = st.p_TK.data<T>();
  T* scores = st.scores_TE.defined() ? st.scores_TE.data<T>() : nullptr;
_Pragma("omp parallel")
  {
    std::vector<uint8_t> taken(E), allowed(E);
    std::vector<T> sel(E), gs(std::max<int64_t>(c.num_groups, 1));
_Pragma("omp for schedule(static)")
    for (int64_t t = 0; t < T_; t++) {
      const T* l = used_logits + t * E;
      int32_t* id = idx + t * K;
      T* pr = p + t * K;
      auto select = [&](const T* v) {
        if (groups)
          group_topk_row(v, E, K, c.num_groups, c.group_topk, id, allowed.data(), taken.data(), gs.data());
        else
          topk_row(v, nullptr, E, K, id, taken.data());
      };
      if (c.score_function == ScoreFunction::Softmax) {
        if (c.pre_softmax) {  // s = softmax(l) over E; p = top-k of s, not renormalized
          T* s = scores + t * E;
          softmax_row(l, s, E);
          select(s);
          for (int64_t j = 0; j < K; j++) pr[j] = s[id[j]];
        } else {  // top-k of the logits, softmax over the k selected
          select(l);
          T sl[256];
          MOE_ASSERT(K <= 256);
          for (int64_t j = 0; j < K; j++) sl[j] = l[id[j]];
          softmax_row(sl, pr, K);
        }
      } else {  // sigmoid: selection on s + bias, probs from s, renormalized over the k selected when k > 1
        T* s = scores + t * E;
        for (int64_t e = 0; e < E; e++) s[e] = sigmoid(l[e]);
        if (bias) {
          for (int64_t e = 0; e < E; e++) sel[e] = s[e] + static_cast<T>(bias[e]);
          select(sel.data());
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
  // Dense probs and map, scaled.
  const T scale = c.topk_scaling_factor > 0 ? T(c.topk_scaling_factor) : T(1);
  probs_TE.zero_();
  map_TE.zero_();
  T* P = probs_TE.data<T>();
  int32_t* M = map_TE.data<int32_t>();
  int32_t* kept = st.kept_TK.data<int32_t>();
  for (int64_t t = 0; t < T_; t++)
    for (int64_t j = 0; j < K; j++) {
      const int64_t e = idx[t * K + j];
      P[t * E + e] = p[t * K + j] * scale;
      M[t * E + e] = 1;
      kept[t * K + j] = 1;
    }
}

// Capacity dropping per expert column (reference §1.2). Returns the number of dropped routed assignments.
template <typename T>
int64_t apply_capacity(const RouterConfig& c, Router::Stash& st, Tensor& probs_TE, Tensor& map_TE) {
  const int64_t T_ = probs_TE.dim(0), E = c.num_experts, K = c.topk;
  int64_t C = expert_capacity(c, T_);
  if (c.pad_to_capacity) C = std::min(C, T_);
  T* P = probs_TE.data<T>();
  int32_t* M = map_TE.data<int32_t>();
  const int32_t* idx = st.idx_TK.data<int32_t>();
  int32_t* kept = st.kept_TK.data<int32_t>();
  int64_t dropped = 0;
_Pragma("omp parallel for schedule(static) reduction(+ : dropped)")
  for (int64_t e = 0; e < E; e++) {
    std::vector<int64_t> cand;
    for (int64_t t = 0; t < T_; t++)
      if (M[t * E + e] || c.pad_to_capacity) cand.push_back(t);
    if (c.drop_policy == DropPolicy::Probs) {
      std::stable_sort(cand.begin(), cand.end(), [&](int64_t a, int64_t b) { return P[a * E + e] > P[b * E + e]; });
    } else {  // position: routed tokens first, earliest first; then (padding) unrouted, earliest first
      std::stable_sort(cand.begin(), cand.end(), [&](int64_t a, int64_t b) { return M[a * E + e] > M[b * E + e]; });
    }
    std::vector<uint8_t> keep(T_, 0);
    for (int64_t i = 0; i < std::min<int64_t>(C, static_cast<int64_t>(cand.size())); i++) keep[cand[i]] = 1;
    for (int64_t t = 0; t < T_; t++) {
      if (M[t * E + e] && !keep[t]) {
        M[t * E + e] = 0;
        P[t * E + e] = 0;
        for (int64_t j = 0; j < K; j++)
          if (idx[t * K + j] == e) kept[t * K + j] = 0;
        dropped++;
      } else if (!M[t * E + e] && keep[t] && c.pad_to_capacity) {
        M[t * E + e] = 1;  // a padding row: a real token with probability 0
      }
    }
  }
  return dropped;
}

// Sums counts over the TP×CP ranks (f64, exact for counts).
void sum_over_group(std::vector<double>& v, const comm::ProcessGroup* g) {
  if (!g || g->size() == 1) return;
  Tensor t = Tensor::empty({static_cast<int64_t>(v.size())}, DType::F64);
  std::copy(v.begin(), v.end(), t.data<double>());
  g->all_reduce(t);
  std::copy(t.data<double>(), t.data<double>() + v.size(), v.begin());
}

// Aux losses: fills st.daux_TE with Σ_types dL/da and returns Σ L; logs L/coeff per type into stats.
template <typename T>
double aux_losses(const RouterConfig& c, Router::Stash& st, Tensor& global_tokens_E, int64_t& ga_steps,
                  RoutingStats* stats) {
  const int64_t T_ = st.aux_scores_TE.dim(0), E = c.num_experts, K = c.topk, S = st.S, B = st.B;
  const int64_t P = c.count_group ? c.count_group->size() : 1;
  const T* a = st.aux_scores_TE.data<T>();
  // Plain top-k on the aux scores (no bias, no groups, no dropping) gives the counts.
  std::vector<int32_t> top(static_cast<size_t>(T_ * K));
  std::vector<uint8_t> taken(static_cast<size_t>(E));
  for (int64_t t = 0; t < T_; t++) topk_row(a + t * E, nullptr, E, K, top.data() + t * K, taken.data());
  T* d = st.daux_TE.data<T>();
  std::fill(d, d + T_ * E, T(0));
  double total = 0;
  for (size_t ty = 0; ty < c.load_balancing.size(); ty++) {
    const double coeff = c.aux_loss_coeff[ty];
    const LoadBalancingType type = c.load_balancing[ty];
    if (type == LoadBalancingType::None || coeff == 0) continue;
    double L = 0;
    if (type == LoadBalancingType::SeqAuxLoss) {
      // Each (sequence b, expert e) pair is an "expert": L = coeff·E/(K·S²·B) Σ_b Σ_e (Σ_{t∈b} a_te)·c_be.
      std::vector<double> cnt(static_cast<size_t>(B * E), 0.0), agg(static_cast<size_t>(B * E), 0.0);
      for (int64_t t = 0; t < T_; t++) {
        const int64_t b = t % B;
        for (int64_t j = 0; j < K; j++) cnt[b * E + top[t * K + j]] += 1;
        for (int64_t e = 0; e < E; e++) agg[b * E + e] += a[t * E + e];
      }
      sum_over_group(cnt, c.count_group);
      const double St = static_cast<double>(S * P);  // the whole sequence
      const double f = coeff * E / (K * St * St * B);
      for (int64_t i = 0; i < B * E; i++) L += agg[i] * cnt[i] * f;
      for (int64_t t = 0; t < T_; t++)
        for (int64_t e = 0; e < E; e++) d[t * E + e] += static_cast<T>(f * cnt[(t % B) * E + e]);
    } else {
      // L = coeff·E/(K·T²) Σ_e (Σ_t a_te)·c_e, with c the micro-batch counts (aux_loss) or the global-batch
      // running mean of counts (global_aux_loss).
      std::vector<double> cnt(static_cast<size_t>(E), 0.0), agg(static_cast<size_t>(E), 0.0);
      for (int64_t t = 0; t < T_; t++) {
        for (int64_t j = 0; j < K; j++) cnt[top[t * K + j]] += 1;
        for (int64_t e = 0; e < E; e++) agg[e] += a[t * E + e];
      }
      const bool global = type == LoadBalancingType::GlobalAuxLoss;
      sum_over_group(cnt, global ? c.global_group : c.count_group);
      const int64_t ranks = global ? (c.global_group ? c.global_group->size() : 1) : P;
      if (global) {
        double* g = global_tokens_E.data<double>();
        ga_steps++;
        for (int64_t e = 0; e < E; e++) {
          g[e] += cnt[e];
          cnt[e] = g[e] / static_cast<double>(ga_steps);
        }
      }
      const double Tt = static_cast<double>(T_ * ranks), gs = global ? c.global_grad_scale : 1.0;
      const double f = coeff * E / (K * Tt * Tt);
      for (int64_t e = 0; e < E; e++) L += agg[e] * cnt[e] * f;
      for (int64_t t = 0; t < T_; t++)
        for (int64_t e = 0; e < E; e++) d[t * E + e] += static_cast<T>(gs * f * cnt[e]);
      if (stats) stats->loss_sums[ty] += L / coeff;
      total += gs * L;
      continue;
    }
    total += L;
    if (stats) stats->loss_sums[ty] += L / coeff;
  }
  return total;
}

}  // namespace

Router::Output Router::forward(const Tensor& x_TH, int64_t S, int64_t B, bool training, Stash& st,
                               RoutingStats* stats) {
  const int64_t T_ = x_TH.rows(), H = cfg_.hidden, E = cfg_.num_experts, K = cfg_.topk;
  MOE_ASSERT(T_ == S * B && x_TH.cols() == H);
  const DType rd = cfg_.router_dtype;
  st.S = S;
  st.B = B;
  // 1. Gating input in router dtype, with multiplicative jitter x ⊙ U(1−ε, 1+ε) when training.
  st.x_r = x_TH.dtype() == rd ? x_TH.reshape({T_, H}) : x_TH.reshape({T_, H}).to(rd);
  st.jitter_TH = Tensor();
  const uint64_t fwd = forward_count_;
  if (training) forward_count_++;
  // Noise is drawn by global token index: under sequence parallelism this rank's tokens start at rank·T.
  const uint64_t tok0 = static_cast<uint64_t>(cfg_.count_group ? cfg_.count_group->rank() * T_ : 0);
  if (training && cfg_.input_jitter_eps > 0) {
    st.jitter_TH = Tensor::empty({T_, H}, rd);
    st.x_r = st.x_r.clone();
    const Philox rng(cfg_.seed, stream_id(weight_->name + "#jitter") + fwd);
    const double eps = cfg_.input_jitter_eps;
    MOE_DISPATCH_FLOAT(rd, R, {
      R* u = st.jitter_TH.data<R>();
      R* xr = st.x_r.data<R>();
      for (int64_t i = 0; i < T_ * H; i++) {
        u[i] = static_cast<R>(1.0 - eps + 2.0 * eps * rng.uniform(tok0 * static_cast<uint64_t>(H) + i));
        xr[i] *= u[i];
      }
    });
  }
  // 2. logits = x·Wᵀ in router dtype.
  st.logits_TE = Tensor::empty({T_, E}, rd);
  const Tensor w_r = weight_->value.dtype() == rd ? weight_->value : weight_->value.to(rd);
  kernels::gemm(st.x_r, false, w_r, true, st.logits_TE);
  // 3. Forced balance (benchmarks): logits replaced by N(0, 1) noise, straight-through gradient.
  Tensor used = st.logits_TE;
  if (cfg_.force_load_balancing) {
    used = Tensor::empty({T_, E}, rd);
    const Philox rng(cfg_.seed, stream_id(weight_->name + "#force_balance") + fwd);
    for (int64_t i = 0; i < T_ * E; i++) used.set_item(i, rng.normal(tok0 * static_cast<uint64_t>(E) + i));
  }
  st.used_TE = used;
  // 4. Scores, top-k, probs; capacity.
  st.idx_TK = Tensor::empty({T_, K}, DType::I32);
  st.p_TK = Tensor::empty({T_, K}, rd);
  st.kept_TK = Tensor::empty({T_, K}, DType::I32);
  const bool need_scores = cfg_.score_function == ScoreFunction::Sigmoid || cfg_.pre_softmax;
  st.scores_TE = need_scores ? Tensor::empty({T_, E}, rd) : Tensor();
  Output out{Tensor::empty({T_, E}, rd), Tensor::empty({T_, E}, DType::I32)};
  int64_t dropped = 0;
  MOE_DISPATCH_FLOAT(rd, R, {
    route_impl<R>(cfg_, st, used.data<R>(), cfg_.enable_expert_bias ? expert_bias_E_.data<float>() : nullptr,
                  out.probs_TE, out.map_TE);
    if (cfg_.capacity_factor >= 0) dropped = apply_capacity<R>(cfg_, st, out.probs_TE, out.map_TE);
  });
  // 5. Aux scores (for the losses and the entropy statistic), losses when training, z-loss.
  st.aux_loss_total = 0;
  st.aux_scores_TE = Tensor::empty({T_, E}, rd);
  st.daux_TE = Tensor();
  st.lse_T = Tensor();
  double entropy = 0;
  MOE_DISPATCH_FLOAT(rd, R, {
    const R* l = used.data<R>();
    R* a = st.aux_scores_TE.data<R>();
_Pragma("omp parallel for schedule(static)")
    for (int64_t t = 0; t < T_; t++) aux_scores_row(cfg_.score_function, l + t * E, a + t * E, E);
    for (int64_t i = 0; i < T_ * E; i++)
      if (a[i] > 0) entropy -= static_cast<double>(a[i]) * std::log(static_cast<double>(a[i]));
  });
  if (stats && (static_cast<int64_t>(stats->tokens_per_expert.size()) != E ||
                stats->loss_sums.size() != cfg_.load_balancing.size())) {
    stats->loss_names.clear();
    for (auto ty : cfg_.load_balancing) stats->loss_names.push_back(load_balancing_name(ty));
    stats->loss_sums.assign(cfg_.load_balancing.size(), 0.0);
    stats->reset(E);
  }
  if (training) {
    bool any_aux = false;
    for (size_t i = 0; i < cfg_.load_balancing.size(); i++)
      any_aux |= cfg_.load_balancing[i] != LoadBalancingType::None && cfg_.aux_loss_coeff[i] > 0;
    if (any_aux) {
      st.daux_TE = Tensor::empty({T_, E}, rd);
      MOE_DISPATCH_FLOAT(rd, R, st.aux_loss_total += aux_losses<R>(cfg_, st, global_tokens_E_, ga_steps_, stats));
    }
    if (cfg_.z_loss_coeff > 0) {  // z = coeff · mean_t (logsumexp_e logits_te)², on the real logits
      st.lse_T = Tensor::empty({T_}, rd);
      double z = 0;
      MOE_DISPATCH_FLOAT(rd, R, {
        const R* l = st.logits_TE.data<R>();
        R* lse = st.lse_T.data<R>();
        for (int64_t t = 0; t < T_; t++) {
          R mx = l[t * E];
          for (int64_t e = 1; e < E; e++) mx = std::max(mx, l[t * E + e]);
          R s = 0;
          for (int64_t e = 0; e < E; e++) s += std::exp(l[t * E + e] - mx);
          lse[t] = mx + std::log(s);
          z += static_cast<double>(lse[t]) * lse[t];
        }
      });
      z = cfg_.z_loss_coeff * z / static_cast<double>(T_ * count_ranks());  // coeff/#(TP×CP) · local mean
      st.aux_loss_total += z;
      if (stats) stats->z_loss_sum += z / cfg_.z_loss_coeff;
    }
    // Expert-bias counts: kept assignments (after dropping, padding rows excluded).
    double* cnt = tokens_per_expert_E_.data<double>();
    const int32_t* idx = st.idx_TK.data<int32_t>();
    const int32_t* kept = st.kept_TK.data<int32_t>();
    for (int64_t i = 0; i < T_ * K; i++)
      if (kept[i]) cnt[idx[i]] += 1;
  }
  if (stats) {
    const int32_t* idx = st.idx_TK.data<int32_t>();
    const int32_t* kept = st.kept_TK.data<int32_t>();
    for (int64_t i = 0; i < T_ * K; i++)
      if (kept[i]) stats->tokens_per_expert[idx[i]]++;
    stats->assignments += T_ * K;
    stats->dropped += dropped;
    stats->entropy_sum += entropy;
    stats->tokens += T_;
    stats->micro_batches++;
  }
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
_Pragma("omp parallel for schedule(static)")
  for (int64_t t = 0; t < T_; t++) {
    T g[256];
    const int32_t* id = idx + t * K;
    // g_j: gradient w.r.t. the unscaled selected prob j (dropped assignments carry none).
    for (int64_t j = 0; j < K; j++) g[j] = kept[t * K + j] ? dP[t * E + id[j]] * scale : T(0);
    T* d = dl + t * E;
    for (int64_t e = 0; e < E; e++) d[e] = 0;
    if (c.score_function == ScoreFunction::Softmax && !c.pre_softmax) {
      // p = softmax(l_sel):  dl_j = p_j·(g_j − Σ_i p_i·g_i)
      T dot = 0;
      for (int64_t j = 0; j < K; j++) dot += p[t * K + j] * g[j];
      for (int64_t j = 0; j < K; j++) d[id[j]] = p[t * K + j] * (g[j] - dot);
    } else if (c.score_function == ScoreFunction::Softmax) {
      // s = softmax(l) over E, p_j = s_{id_j}:  dl_e = s_e·(ds_e − Σ_i s_i·ds_i), ds nonzero on the selected
      const T* se = s + t * E;
      T dot = 0;
      for (int64_t j = 0; j < K; j++) dot += se[id[j]] * g[j];
      for (int64_t e = 0; e < E; e++) d[e] = -se[e] * dot;
      for (int64_t j = 0; j < K; j++) d[id[j]] += se[id[j]] * g[j];
    } else {
      // s = σ(l); p_j = s_j/Z with Z = Σ_sel s + 1e-20 when K > 1:
      //   ds_i = g_i/Z − (Σ_j g_j·s_j)/Z²;  dl_i = ds_i·s_i·(1 − s_i)
      const T* se = s + t * E;
      T z = 0, gs = 0;
      for (int64_t j = 0; j < K; j++) {
        z += se[id[j]];
        gs += g[j] * se[id[j]];
      }
      z += T(1e-20);
      for (int64_t j = 0; j < K; j++) {
        const T si = se[id[j]];
        const T ds = K > 1 ? g[j] / z - gs / (z * z) : g[j];
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
_Pragma("omp parallel for schedule(static)")
  for (int64_t t = 0; t < T_; t++) {
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

Tensor Router::backward(const Tensor& dprobs_TE, DType x_dtype, double aux_grad_scale, Stash& st) {
  const int64_t T_ = st.logits_TE.dim(0), E = cfg_.num_experts, H = cfg_.hidden;
  const DType rd = cfg_.router_dtype;
  MOE_ASSERT(dprobs_TE.dtype() == rd && dprobs_TE.numel() == T_ * E);
  Tensor dl = Tensor::empty({T_, E}, rd);
  MOE_DISPATCH_FLOAT(rd, R, {
    R* d = dl.data<R>();
    score_backward<R>(cfg_, st, dprobs_TE.data<R>(), d);
    if (st.daux_TE.defined()) {
      // The aux scores were computed from the logits actually routed on; with forced balance those are noise
      // and the gradient passes straight through to the real logits.
      aux_score_backward<R>(cfg_.score_function, st.used_TE.data<R>(), st.aux_scores_TE.data<R>(),
                            st.daux_TE.data<R>(), d, T_, E, R(aux_grad_scale));
    }
    if (st.lse_T.defined()) {
      // z = coeff/T · Σ_t lse_t²:  dl_te = coeff · 2·lse_t/T · softmax(l)_te
      const R* l = st.logits_TE.data<R>();
      const R* lse = st.lse_T.data<R>();
      const R f = R(aux_grad_scale * cfg_.z_loss_coeff * 2.0 / static_cast<double>(T_ * count_ranks()));
      for (int64_t t = 0; t < T_; t++)
        for (int64_t e = 0; e < E; e++) d[t * E + e] += f * lse[t] * std::exp(l[t * E + e] - lse[t]);
    }
  });
  // Gating backward: dx_r = dl·W, dW += dlᵀ·x_r (in router dtype), then through the jitter: dx = dx_r ⊙ u.
  const Tensor w_r = weight_->value.dtype() == rd ? weight_->value : weight_->value.to(rd);
  Tensor dx_r = Tensor::empty({T_, H}, rd);
  kernels::gemm(dl, false, w_r, false, dx_r);
  if (weight_->grad.dtype() == rd) {
    kernels::gemm(dl, true, st.x_r, false, weight_->grad, 1.0f, 1.0f);
  } else {
    Tensor dw = Tensor::empty({E, H}, rd);
    kernels::gemm(dl, true, st.x_r, false, dw);
    Tensor dw_cast = dw.to(weight_->grad.dtype());
    kernels::add_(weight_->grad, dw_cast);
  }
  if (st.jitter_TH.defined()) {
    MOE_DISPATCH_FLOAT(rd, R, {
      R* d = dx_r.data<R>();
      const R* u = st.jitter_TH.data<R>();
      for (int64_t i = 0; i < T_ * H; i++) d[i] *= u[i];
    });
  }
  st = Stash{};
  return x_dtype == rd ? dx_r : dx_r.to(x_dtype);
}

void Router::finish_global_batch() {
  if (cfg_.enable_expert_bias) {
    const int64_t E = cfg_.num_experts;
    const double* c = tokens_per_expert_E_.data<double>();
    float* b = expert_bias_E_.data<float>();
    double mean = 0;
    for (int64_t e = 0; e < E; e++) mean += c[e];
    mean /= static_cast<double>(E);
    for (int64_t e = 0; e < E; e++) {
      const double off = mean - c[e];
      const double sign = off > 0 ? 1.0 : (off < 0 ? -1.0 : 0.0);
      b[e] = static_cast<float>(b[e] + sign * cfg_.bias_update_rate);
    }
  }
  reset_counters();
}

void Router::reset_counters() {
  tokens_per_expert_E_.zero_();
  global_tokens_E_.zero_();
  ga_steps_ = 0;
}

}  // namespace moecore::moe
