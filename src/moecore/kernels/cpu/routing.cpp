// The router's ops on the CPU (see kernels/routing.h), in the router dtype R (f32 or f64): a token per loop
// iteration, threads over tokens (or experts for capacity), every sum in a fixed order. Formulas follow reference
// §1.1a/§1.1b/§1.2; each backward term is derived next to its code. Top-k breaks ties toward the lower expert index
// (torch.topk leaves this to the backend).
#include "moecore/kernels/routing.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "moecore/kernels/backends.h"

namespace moecore::kernels::cpu {

namespace {

// Per-thread selection scratch, in 8-byte words: selection scores [E] and group scores [G] (at most 8 bytes each),
// the taken and allowed masks [E] (bytes), the top ids inside a group [K] and the selected groups [G] (I32).
struct RowScratch {
  void* sel;
  void* group_scores;
  uint8_t* taken;
  uint8_t* allowed;
  int32_t* inner;
  int32_t* groups;
};

// Groups take scratch only with group_topk (num_groups alone routes over all experts, and is then not bounded by
// them).
int64_t scratch_groups(const RouterRule& rule) {
  return rule.group_topk > 0 ? rule.num_groups : 1;
}

int64_t scratch_words(const RouterRule& rule, int64_t E) {
  const int64_t G = scratch_groups(rule), K = rule.K;
  return E + G + (2 * E + 7) / 8 + (K + G + 1) / 2;
}

RowScratch row_scratch(const RouterRule& rule, int64_t E, int64_t* w) {
  const int64_t G = scratch_groups(rule), K = rule.K;
  RowScratch r{};
  r.sel = w;
  r.group_scores = w + E;
  r.taken = reinterpret_cast<uint8_t*>(w + E + G);
  r.allowed = r.taken + E;
  r.inner = reinterpret_cast<int32_t*>(w + E + G + (2 * E + 7) / 8);
  r.groups = r.inner + K;
  return r;
}

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
void router_softmax_row(const T* l, T* out, int64_t n) {
  T mx = -std::numeric_limits<T>::infinity();
  for (int64_t i = 0; i < n; i++) mx = std::max(mx, l[i]);
  T s = 0;
  for (int64_t i = 0; i < n; i++) s += (out[i] = std::exp(l[i] - mx));
  for (int64_t i = 0; i < n; i++) out[i] /= s;
}

template <typename T>
inline T router_sigmoid(T x) {
  return T(1) / (T(1) + std::exp(-x));
}

// Aux scores (reference §1.1b compute_routing_scores_for_aux_loss): softmax over E, or sigmoid normalized to sum 1.
template <typename T>
void aux_scores_row(bool sigmoid, const T* l, T* a, int64_t E) {
  if (!sigmoid) {
    router_softmax_row(l, a, E);
  } else {
    T z = 0;
    for (int64_t e = 0; e < E; e++) z += (a[e] = router_sigmoid(l[e]));
    z += T(1e-20);
    for (int64_t e = 0; e < E; e++) a[e] /= z;
  }
}

// log Σ_e exp(l_e), from the largest logit.
template <typename T>
T logsumexp_row(const T* l, int64_t E) {
  T mx = l[0];
  for (int64_t e = 1; e < E; e++) mx = std::max(mx, l[e]);
  T s = 0;
  for (int64_t e = 0; e < E; e++) s += std::exp(l[e] - mx);
  return mx + std::log(s);
}

template <typename T>
void rows_impl(const RouterRule& c, RouterRows& r) {
  const int64_t T_ = r.used_TE.dim(0), E = r.used_TE.dim(1), K = c.K;
  const bool groups = c.group_topk > 0;
  const T* used = r.used_TE.data<T>();
  const float* bias = r.bias_E.defined() ? r.bias_E.data<float>() : nullptr;
  const double* sinkhorn = r.sinkhorn_TE.defined() ? r.sinkhorn_TE.data<double>() : nullptr;
  int32_t* idx = r.idx_TK.data<int32_t>();
  T* p = r.p_TK.data<T>();
  T* scores = r.scores_TE.defined() ? r.scores_TE.data<T>() : nullptr;
  T* aux = r.aux_scores_TE.defined() ? r.aux_scores_TE.data<T>() : nullptr;
  int32_t* aux_top = r.aux_top_TK.defined() ? r.aux_top_TK.data<int32_t>() : nullptr;
  const T* logits = r.logits_TE.defined() ? r.logits_TE.data<T>() : nullptr;
  T* lse = r.lse_T.defined() ? r.lse_T.data<T>() : nullptr;
  const int nthreads = std::max(1, omp_get_max_threads());
  const int64_t words = scratch_words(c, E);
  Tensor scratch = Tensor::empty({nthreads, words}, DType::I64);
  _Pragma("omp parallel num_threads(nthreads)") {
    const RowScratch rs = row_scratch(c, E, scratch.data<int64_t>() + omp_get_thread_num() * words);
    T* sel = static_cast<T*>(rs.sel);
    _Pragma("omp for schedule(static)") for (int64_t t = 0; t < T_; t++) {
      const T* l = used + t * E;
      int32_t* id = idx + t * K;
      T* pr = p + t * K;
      auto select = [&](const T* v) {
        if (sinkhorn)  // training under sinkhorn: the experts come from the balanced cost, the probs from v
          topk_row(sinkhorn + t * E, nullptr, E, K, id, rs.taken);
        else if (groups)
          group_topk_row(v, E, K, c.num_groups, c.group_topk, id, rs);
        else
          topk_row(v, nullptr, E, K, id, rs.taken);
      };
      if (!c.sigmoid) {
        if (c.pre_softmax) {  // s = softmax(l) over E; p = top-k of s, not renormalized
          T* s = scores + t * E;
          router_softmax_row(l, s, E);
          select(s);
          for (int64_t j = 0; j < K; j++) pr[j] = s[id[j]];
        } else {  // top-k of the logits, softmax over the k selected
          select(l);
          for (int64_t j = 0; j < K; j++) pr[j] = l[id[j]];
          router_softmax_row(pr, pr, K);
        }
      } else {  // sigmoid: selection on s + bias, probs from s, renormalized over the k selected when k > 1
        T* s = scores + t * E;
        for (int64_t e = 0; e < E; e++) s[e] = router_sigmoid(l[e]);
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
      if (aux) {
        aux_scores_row(c.sigmoid, l, aux + t * E, E);
        if (aux_top) topk_row(aux + t * E, nullptr, E, K, aux_top + t * K, rs.taken);
      }
      if (lse) lse[t] = logsumexp_row(logits + t * E, E);
    }
  }
  const T scale = T(c.scale);
  T* P = r.probs_TK.data<T>();
  int32_t* kept = r.kept_TK.data<int32_t>();
  for (int64_t i = 0; i < T_ * K; i++) {
    P[i] = p[i] * scale;
    kept[i] = 1;
  }
  if (!r.sums_2.defined()) return;
  // The sums in one order, token after token, whatever the thread count.
  double* sums = r.sums_2.data<double>();
  sums[0] = sums[1] = 0;
  if (aux)
    for (int64_t i = 0; i < T_ * E; i++)
      if (aux[i] > 0) sums[0] -= static_cast<double>(aux[i]) * std::log(static_cast<double>(aux[i]));
  if (lse)
    for (int64_t t = 0; t < T_; t++) sums[1] += static_cast<double>(lse[t]) * lse[t];
}

}  // namespace

void router_rows(const RouterRule& rule, RouterRows& r) {
  const int64_t T_ = r.used_TE.dim(0), E = r.used_TE.dim(1), K = rule.K;
  const DType rd = r.used_TE.dtype();
  MOE_ASSERT(r.idx_TK.numel() == T_ * K && r.kept_TK.numel() == T_ * K && r.p_TK.numel() == T_ * K);
  MOE_ASSERT(r.probs_TK.numel() == T_ * K && r.p_TK.dtype() == rd && r.probs_TK.dtype() == rd);
  MOE_ASSERT(r.scores_TE.defined() == (rule.sigmoid || rule.pre_softmax));
  MOE_ASSERT(!r.aux_top_TK.defined() || r.aux_scores_TE.defined());
  MOE_ASSERT(r.lse_T.defined() == r.logits_TE.defined());
  MOE_ASSERT(!r.sums_2.defined() || (r.sums_2.numel() == 2 && r.sums_2.dtype() == DType::F64));
  MOE_ASSERT(!r.bias_E.defined() || (r.bias_E.numel() == E && r.bias_E.dtype() == DType::F32));
  MOE_ASSERT(!r.sinkhorn_TE.defined() || (r.sinkhorn_TE.numel() == T_ * E && r.sinkhorn_TE.dtype() == DType::F64));
  MOE_DISPATCH_FLOAT(rd, R, { rows_impl<R>(rule, r); });
}

namespace {

template <typename T>
void capacity_impl(const int32_t* idx, T* P, int32_t* kept, int64_t T_, int64_t E, int64_t K, int64_t C,
                   bool by_position, bool pad) {
  const int64_t n_all = T_ * K;
  // Assignments t·K + j grouped by expert, ascending token inside an expert (counting sort).
  Tensor off_t = Tensor::zeros({E + 1}, DType::I64), ent_t = Tensor::empty({std::max<int64_t>(n_all, 1)}, DType::I64);
  int64_t* off = off_t.data<int64_t>();
  int64_t* ent = ent_t.data<int64_t>();
  for (int64_t i = 0; i < n_all; i++) off[idx[i] + 1]++;
  for (int64_t e = 0; e < E; e++) off[e + 1] += off[e];
  for (int64_t i = 0; i < n_all; i++) ent[off[idx[i]]++] = i;  // off[e] ends at the start of e + 1
  for (int64_t e = E; e > 0; e--) off[e] = off[e - 1];
  off[0] = 0;
  _Pragma("omp parallel for schedule(static)") for (int64_t e = 0; e < E; e++) {
    int64_t* seg = ent + off[e];
    const int64_t n = off[e + 1] - off[e];
    auto drop = [&](int64_t i) {
      kept[i] = 0;
      P[i] = 0;
    };
    if (by_position) {  // routed tokens first, earliest first
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
      const int64_t rank = a + (pad ? t - pos_before : zeros_before);
      zeros_before++;
      if (rank >= C) drop(seg[i]);
    }
  }
}

}  // namespace

void router_capacity(const Tensor& idx_TK, Tensor& probs_TK, Tensor& kept_TK, int64_t E, int64_t C, bool by_position,
                     bool pad) {
  const int64_t T_ = idx_TK.dim(0), K = idx_TK.dim(1);
  MOE_ASSERT(idx_TK.dtype() == DType::I32 && kept_TK.dtype() == DType::I32 && probs_TK.numel() == T_ * K);
  MOE_ASSERT(kept_TK.numel() == T_ * K);
  MOE_DISPATCH_FLOAT(probs_TK.dtype(), R, {
    capacity_impl(idx_TK.data<int32_t>(), probs_TK.data<R>(), kept_TK.data<int32_t>(), T_, E, K, C, by_position, pad);
  });
}

void router_mask_ids(const Tensor& idx_TK, const Tensor& kept_TK, Tensor& ids_TK) {
  const int64_t n = idx_TK.numel();
  MOE_ASSERT(kept_TK.numel() == n && ids_TK.numel() == n && ids_TK.dtype() == DType::I32);
  const int32_t* idx = idx_TK.data<int32_t>();
  const int32_t* kept = kept_TK.data<int32_t>();
  int32_t* out = ids_TK.data<int32_t>();
  for (int64_t i = 0; i < n; i++) out[i] = kept[i] ? idx[i] : -1;
}

void router_expert_counts(const Tensor& ids_TK, Tensor& counts_E) {
  const int64_t n = ids_TK.numel(), E = counts_E.numel();
  MOE_ASSERT(ids_TK.dtype() == DType::I32 && counts_E.dtype() == DType::F64);
  const int32_t* id = ids_TK.data<int32_t>();
  double* c = counts_E.data<double>();
  std::fill(c, c + E, 0.0);
  for (int64_t i = 0; i < n; i++)
    if (id[i] >= 0 && id[i] < E) c[id[i]] += 1;
}

void router_aux_counts(const Tensor& a_TE, const Tensor& top_TK, int64_t G, Tensor& cnt_GE, Tensor& agg_GE) {
  const int64_t T_ = a_TE.dim(0), E = a_TE.dim(1), K = top_TK.dim(1);
  MOE_ASSERT(top_TK.dtype() == DType::I32 && top_TK.dim(0) == T_ && G >= 1);
  MOE_ASSERT(cnt_GE.numel() == G * E && agg_GE.numel() == G * E);
  MOE_ASSERT(cnt_GE.dtype() == DType::F64 && agg_GE.dtype() == DType::F64);
  const int32_t* top = top_TK.data<int32_t>();
  double* cnt = cnt_GE.data<double>();
  double* agg = agg_GE.data<double>();
  std::fill(cnt, cnt + G * E, 0.0);
  std::fill(agg, agg + G * E, 0.0);
  MOE_DISPATCH_FLOAT(a_TE.dtype(), R, {
    const R* a = a_TE.data<R>();
    for (int64_t t = 0; t < T_; t++) {
      const int64_t g = t % G;
      for (int64_t j = 0; j < K; j++) cnt[g * E + top[t * K + j]] += 1;
      for (int64_t e = 0; e < E; e++) agg[g * E + e] += a[t * E + e];
    }
  });
}

void router_add_class_coef(Tensor& da_TE, const Tensor& coef_GE) {
  const int64_t T_ = da_TE.dim(0), E = da_TE.dim(1), G = coef_GE.numel() / E;
  MOE_ASSERT(G >= 1 && coef_GE.numel() == G * E && coef_GE.dtype() == da_TE.dtype());
  MOE_DISPATCH_FLOAT(da_TE.dtype(), R, {
    R* d = da_TE.data<R>();
    const R* coef = coef_GE.data<R>();
    for (int64_t t = 0; t < T_; t++)
      for (int64_t e = 0; e < E; e++) d[t * E + e] += coef[(t % G) * E + e];
  });
}

void router_mul_(Tensor& a, const Tensor& u) {
  MOE_ASSERT(a.numel() == u.numel() && a.dtype() == u.dtype());
  MOE_DISPATCH_FLOAT(a.dtype(), R, {
    R* x = a.data<R>();
    const R* m = u.data<R>();
    const int64_t n = a.numel();
    for (int64_t i = 0; i < n; i++) x[i] *= m[i];
  });
}

namespace {

template <typename T>
void score_backward_impl(const RouterRule& c, const T* dP, const int32_t* idx, const int32_t* kept, const T* p,
                         const T* s, int64_t T_, int64_t E, T* dl) {
  const int64_t K = c.K;
  const T scale = T(c.scale);
  _Pragma("omp parallel for schedule(static)") for (int64_t t = 0; t < T_; t++) {
    const int32_t* id = idx + t * K;
    // g_j: gradient w.r.t. the unscaled selected prob j (dropped assignments carry none).
    auto g = [&](int64_t j) { return kept[t * K + j] ? dP[t * K + j] * scale : T(0); };
    T* d = dl + t * E;
    for (int64_t e = 0; e < E; e++) d[e] = 0;
    if (!c.sigmoid && !c.pre_softmax) {
      // p = softmax(l_sel):  dl_j = p_j·(g_j − Σ_i p_i·g_i)
      T dot = 0;
      for (int64_t j = 0; j < K; j++) dot += p[t * K + j] * g(j);
      for (int64_t j = 0; j < K; j++) d[id[j]] = p[t * K + j] * (g(j) - dot);
    } else if (!c.sigmoid) {
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
void aux_score_backward_impl(bool sigmoid, const T* used, const T* a, const T* da, T* dl, int64_t T_, int64_t E,
                             T scale) {
  _Pragma("omp parallel for schedule(static)") for (int64_t t = 0; t < T_; t++) {
    const T* ar = a + t * E;
    const T* dr = da + t * E;
    T* out = dl + t * E;
    if (!sigmoid) {
      T dot = 0;
      for (int64_t e = 0; e < E; e++) dot += ar[e] * dr[e];
      for (int64_t e = 0; e < E; e++) out[e] += scale * ar[e] * (dr[e] - dot);
    } else {
      const T* l = used + t * E;
      T z = 0, dot = 0;
      for (int64_t e = 0; e < E; e++) {
        const T sg = router_sigmoid(l[e]);
        z += sg;
        dot += dr[e] * sg;
      }
      z += T(1e-20);
      for (int64_t e = 0; e < E; e++) {
        const T sg = router_sigmoid(l[e]);
        out[e] += scale * (dr[e] / z - dot / (z * z)) * sg * (T(1) - sg);
      }
    }
  }
}

}  // namespace

void router_score_backward(const RouterRule& rule, const Tensor& dprobs_TK, const Tensor& idx_TK, const Tensor& kept_TK,
                           const Tensor& p_TK, const Tensor& scores_TE, Tensor& dl_TE) {
  const int64_t T_ = dl_TE.dim(0), E = dl_TE.dim(1), K = rule.K;
  const DType rd = dl_TE.dtype();
  MOE_ASSERT(dprobs_TK.dtype() == rd && p_TK.dtype() == rd && dprobs_TK.numel() == T_ * K);
  MOE_ASSERT(idx_TK.numel() == T_ * K && kept_TK.numel() == T_ * K && p_TK.numel() == T_ * K);
  MOE_ASSERT(scores_TE.defined() == (rule.sigmoid || rule.pre_softmax));
  MOE_DISPATCH_FLOAT(rd, R, {
    score_backward_impl<R>(rule, dprobs_TK.data<R>(), idx_TK.data<int32_t>(), kept_TK.data<int32_t>(), p_TK.data<R>(),
                           scores_TE.defined() ? scores_TE.data<R>() : nullptr, T_, E, dl_TE.data<R>());
  });
}

void router_aux_score_backward(bool sigmoid, const Tensor& used_TE, const Tensor& a_TE, const Tensor& da_TE,
                               double scale, Tensor& dl_TE) {
  const int64_t T_ = dl_TE.dim(0), E = dl_TE.dim(1);
  const DType rd = dl_TE.dtype();
  MOE_ASSERT(used_TE.numel() == T_ * E && a_TE.numel() == T_ * E && da_TE.numel() == T_ * E);
  MOE_ASSERT(used_TE.dtype() == rd && a_TE.dtype() == rd && da_TE.dtype() == rd);
  MOE_DISPATCH_FLOAT(rd, R, {
    aux_score_backward_impl<R>(sigmoid, used_TE.data<R>(), a_TE.data<R>(), da_TE.data<R>(), dl_TE.data<R>(), T_, E,
                               R(scale));
  });
}

void router_z_loss_backward(const Tensor& logits_TE, const Tensor& lse_T, double f, Tensor& dl_TE) {
  const int64_t T_ = logits_TE.dim(0), E = logits_TE.dim(1);
  MOE_ASSERT(dl_TE.numel() == T_ * E && dl_TE.dtype() == logits_TE.dtype() && lse_T.numel() == T_);
  MOE_ASSERT(lse_T.dtype() == logits_TE.dtype());
  MOE_DISPATCH_FLOAT(logits_TE.dtype(), R, {
    // z = coeff/T · Σ_t lse_t²:  dl_te = coeff · 2·lse_t/T · exp(l_te − lse_t), f = coeff · 2/T (times the scale)
    const R* l = logits_TE.data<R>();
    const R* lse = lse_T.data<R>();
    R* d = dl_TE.data<R>();
    const R fr = R(f);
    for (int64_t t = 0; t < T_; t++)
      for (int64_t e = 0; e < E; e++) d[t * E + e] += fr * lse[t] * std::exp(l[t * E + e] - lse[t]);
  });
}

// The CPU routes in either router dtype: nothing to refuse.
void router_check_backend(DType) {}

const RouterKernels kRouterKernels{router_check_backend,      router_rows,           router_capacity,
                                   router_mask_ids,           router_expert_counts,  router_aux_counts,
                                   router_add_class_coef,     router_mul_,           router_score_backward,
                                   router_aux_score_backward, router_z_loss_backward};

}  // namespace moecore::kernels::cpu
