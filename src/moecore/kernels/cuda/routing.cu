// MoE router kernels (see launch_routing.h): the fused per-token forward, the small reductions of the aux losses
// and statistics, and the backward of the score functions. The per-token kernels give each token one thread that
// runs the CPU router's loops in the same order (kernels/cpu/routing.cpp), so sums round alike and only exp/log
// differ by an ulp; top-k needs no taken mask: the j-th pick is the first element after the (j−1)-th in selection
// order.
#include <cmath>

#include "moecore/kernels/cuda/common.cuh"
#include "moecore/kernels/cuda/launch_routing.h"

namespace moecore::launch {

namespace {

constexpr int kRowThreads = 128;

__device__ __forceinline__ float sigmoid_f(float x) {
  return 1.0f / (1.0f + expf(-x));
}

// True when (va, a) comes before (vb, b) in selection order: the larger value first, ties to the lower index.
template <typename X>
__device__ __forceinline__ bool before(X va, int64_t a, X vb, int64_t b) {
  return va > vb || (va == vb && a < b);
}

// Top-k of v(e) over the allowed e in [0, n), largest first, ties to the lower index (the CPU's repeated argmax
// over the untaken ones); pick(j, e, v(e)) receives each choice. Values f32, or f64 (Sinkhorn's cost), compared in
// their own type.
template <typename V, typename A, typename P>
__device__ void topk(const V& v, const A& allowed, int64_t n, int64_t k, const P& pick) {
  using X = decltype(v(int64_t{0}));
  X pv = 0;
  int64_t pi = -1;
  for (int64_t j = 0; j < k; j++) {
    int64_t best = -1;
    X bv = 0;
    for (int64_t e = 0; e < n; e++) {
      if (!allowed(e)) continue;
      const X x = v(e);
      if (pi >= 0 && !before(pv, pi, x, e)) continue;  // picked already
      if (best < 0 || x > bv) {
        best = e;
        bv = x;
      }
    }
    if (best < 0) best = 0;  // unreachable for a valid config (validate() bounds k); keeps the ids in range
    pick(j, best, bv);
    pv = bv;
    pi = best;
  }
}

// Plain or group-limited (Megatron's group_limited_topk: groups scored by the sum of their top K/g values, the best
// g kept) selection of the K experts of token t into id.
template <typename V>
__device__ void select_row(const RouterRowArgs& a, int64_t t, const V& v, int32_t* id) {
  const int64_t E = a.E, K = a.K;
  auto all = [](int64_t) { return true; };
  auto to_id = [&](int64_t j, int64_t e, auto) { id[j] = static_cast<int32_t>(e); };
  if (a.sinkhorn) {  // training under Sinkhorn: the experts come from the balanced cost, the probabilities from v
    const double* c = a.sinkhorn + t * E;
    topk([&](int64_t e) { return c[e]; }, all, E, K, to_id);
    return;
  }
  if (a.group_topk <= 0) {
    topk(v, all, E, K, to_id);
    return;
  }
  const int64_t G = a.num_groups, g = a.group_topk, n = E / G, per = K / g;
  float* gs = a.group_scores + t * G;
  int32_t* gsel = a.group_sel + t * G;
  for (int64_t grp = 0; grp < G; grp++) {
    float sum = 0.0f;
    topk([&](int64_t e) { return v(grp * n + e); }, all, n, per, [&](int64_t, int64_t, float x) { sum += x; });
    gs[grp] = sum;
    gsel[grp] = 0;
  }
  topk([&](int64_t e) { return gs[e]; }, all, G, g, [&](int64_t, int64_t e, float) { gsel[e] = 1; });
  topk(
      v, [&](int64_t e) { return gsel[e / n] != 0; }, E, K, to_id);
}

// out = softmax(l) over n values (out may alias l), the CPU's softmax_row.
__device__ void softmax_n(const float* l, float* out, int64_t n) {
  float mx = -INFINITY;
  for (int64_t i = 0; i < n; i++) mx = mx < l[i] ? l[i] : mx;
  float s = 0.0f;
  for (int64_t i = 0; i < n; i++) s += (out[i] = expf(l[i] - mx));
  for (int64_t i = 0; i < n; i++) out[i] /= s;
}

__global__ void rows_k(RouterRowArgs a) {
  const int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (t >= a.T) return;
  const int64_t E = a.E, K = a.K;
  const float* l = a.used + t * E;
  int32_t* id = a.idx + t * K;
  float* pr = a.p + t * K;
  if (!a.sigmoid) {
    if (a.pre_softmax) {  // s = softmax(l) over E; p = top-k of s, not renormalised
      float* s = a.scores + t * E;
      softmax_n(l, s, E);
      select_row(
          a, t, [&](int64_t e) { return s[e]; }, id);
      for (int64_t j = 0; j < K; j++) pr[j] = s[id[j]];
    } else {  // top-k of the logits, softmax over the k selected
      select_row(
          a, t, [&](int64_t e) { return l[e]; }, id);
      for (int64_t j = 0; j < K; j++) pr[j] = l[id[j]];
      softmax_n(pr, pr, K);
    }
  } else {  // sigmoid: selection on s + bias, probs from s, renormalised over the k selected when k > 1
    float* s = a.scores + t * E;
    for (int64_t e = 0; e < E; e++) s[e] = sigmoid_f(l[e]);
    if (a.bias) {
      const float* b = a.bias;
      select_row(
          a, t, [&](int64_t e) { return s[e] + b[e]; }, id);
    } else {
      select_row(
          a, t, [&](int64_t e) { return s[e]; }, id);
    }
    float z = 0.0f;
    for (int64_t j = 0; j < K; j++) z += (pr[j] = s[id[j]]);
    if (K > 1)
      for (int64_t j = 0; j < K; j++) pr[j] /= (z + 1e-20f);
  }
  for (int64_t j = 0; j < K; j++) {
    a.probs[t * K + j] = pr[j] * a.scale;
    a.kept[t * K + j] = 1;
  }
  if (a.aux_scores) {  // aux scores (softmax, or sigmoid normalised to sum 1), their plain top-k, the entropy
    float* as = a.aux_scores + t * E;
    if (!a.sigmoid) {
      softmax_n(l, as, E);
    } else {
      float z = 0.0f;
      for (int64_t e = 0; e < E; e++) z += (as[e] = sigmoid_f(l[e]));
      z += 1e-20f;
      for (int64_t e = 0; e < E; e++) as[e] /= z;
    }
    if (a.aux_top) {
      int32_t* top = a.aux_top + t * K;
      topk([&](int64_t e) { return as[e]; }, [](int64_t) { return true; }, E, K,
           [&](int64_t j, int64_t e, float) { top[j] = static_cast<int32_t>(e); });
    }
    double ent = 0.0;
    for (int64_t e = 0; e < E; e++)
      if (as[e] > 0.0f) ent -= static_cast<double>(as[e]) * log(static_cast<double>(as[e]));
    a.entropy_T[t] = ent;
  }
  if (a.logits) {  // logsumexp of the real logits (z-loss), as the CPU's z_loss
    const float* r = a.logits + t * E;
    float mx = r[0];
    for (int64_t e = 1; e < E; e++) mx = mx < r[e] ? r[e] : mx;
    float s = 0.0f;
    for (int64_t e = 0; e < E; e++) s += expf(r[e] - mx);
    const float lse = mx + logf(s);
    a.lse[t] = lse;
    a.lse_sq_T[t] = static_cast<double>(lse) * lse;
  }
}

__global__ void mask_ids_k(const int32_t* idx, const int32_t* kept, int32_t* out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = kept[i] ? idx[i] : -1;
}

__global__ void expert_counts_k(const int32_t* ids, int64_t n, double* counts) {
  __shared__ long long sm[kThreads];
  const int e = blockIdx.x;
  long long c = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) c += ids[i] == e;
  c = block_sum(c, sm);
  if (threadIdx.x == 0) counts[e] = static_cast<double>(c);
}

__global__ void aux_counts_k(const float* a, const int32_t* top, int64_t T, int64_t E, int64_t K, int64_t G,
                             double* cnt, double* agg) {
  __shared__ double sm[kThreads];
  const int64_t ge = blockIdx.x, g = ge / E, e = ge % E;
  double c = 0.0, s = 0.0;
  for (int64_t t = g + G * int64_t(threadIdx.x); t < T; t += G * int64_t(blockDim.x)) {
    for (int64_t j = 0; j < K; j++) c += top[t * K + j] == e ? 1.0 : 0.0;
    s += a[t * E + e];
  }
  c = block_sum(c, sm);
  s = block_sum(s, sm);
  if (threadIdx.x == 0) {
    cnt[ge] = c;
    agg[ge] = s;
  }
}

__global__ void add_class_coef_k(float* d, const float* coef, int64_t T, int64_t E, int64_t G) {
  const int64_t n = T * E;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    d[i] += coef[((i / E) % G) * E + i % E];
}

__global__ void sum_f64_k(const double* v, int64_t n, double* out) {
  __shared__ double sm[kThreads];
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += v[i];
  s = block_sum(s, sm);
  if (threadIdx.x == 0) out[0] = s;
}

__global__ void mul_k(float* a, const float* u, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    a[i] *= u[i];
}

// The CPU's score_backward, one thread per token (derivations in kernels/cpu/routing.cpp).
__global__ void score_backward_k(const float* dP, const int32_t* idx, const int32_t* kept, const float* p,
                                 const float* scores, bool sigmoid, bool pre_softmax, float scale, int64_t T, int64_t E,
                                 int64_t K, float* dl) {
  const int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (t >= T) return;
  const int32_t* id = idx + t * K;
  auto g = [&](int64_t j) { return kept[t * K + j] ? dP[t * K + j] * scale : 0.0f; };
  float* d = dl + t * E;
  for (int64_t e = 0; e < E; e++) d[e] = 0.0f;
  if (!sigmoid && !pre_softmax) {
    float dot = 0.0f;
    for (int64_t j = 0; j < K; j++) dot += p[t * K + j] * g(j);
    for (int64_t j = 0; j < K; j++) d[id[j]] = p[t * K + j] * (g(j) - dot);
  } else if (!sigmoid) {
    const float* se = scores + t * E;
    float dot = 0.0f;
    for (int64_t j = 0; j < K; j++) dot += se[id[j]] * g(j);
    for (int64_t e = 0; e < E; e++) d[e] = -se[e] * dot;
    for (int64_t j = 0; j < K; j++) d[id[j]] += se[id[j]] * g(j);
  } else {
    const float* se = scores + t * E;
    float z = 0.0f, gs = 0.0f;
    for (int64_t j = 0; j < K; j++) {
      z += se[id[j]];
      gs += g(j) * se[id[j]];
    }
    z += 1e-20f;
    for (int64_t j = 0; j < K; j++) {
      const float si = se[id[j]];
      const float ds = K > 1 ? g(j) / z - gs / (z * z) : g(j);
      d[id[j]] = ds * si * (1.0f - si);
    }
  }
}

__global__ void aux_score_backward_k(bool sigmoid, const float* used, const float* a, const float* da, float* dl,
                                     int64_t T, int64_t E, float scale) {
  const int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (t >= T) return;
  const float* ar = a + t * E;
  const float* dr = da + t * E;
  float* out = dl + t * E;
  if (!sigmoid) {
    float dot = 0.0f;
    for (int64_t e = 0; e < E; e++) dot += ar[e] * dr[e];
    for (int64_t e = 0; e < E; e++) out[e] += scale * ar[e] * (dr[e] - dot);
  } else {
    const float* l = used + t * E;
    float z = 0.0f, dot = 0.0f;
    for (int64_t e = 0; e < E; e++) {
      const float sg = sigmoid_f(l[e]);
      z += sg;
      dot += dr[e] * sg;
    }
    z += 1e-20f;
    for (int64_t e = 0; e < E; e++) {
      const float sg = sigmoid_f(l[e]);
      out[e] += scale * (dr[e] / z - dot / (z * z)) * sg * (1.0f - sg);
    }
  }
}

__global__ void z_loss_backward_k(const float* l, const float* lse, float f, int64_t T, int64_t E, float* d) {
  const int64_t n = T * E;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float m = lse[i / E];
    d[i] += f * m * expf(l[i] - m);
  }
}

unsigned token_grid(int64_t T) {
  return static_cast<unsigned>((T + kRowThreads - 1) / kRowThreads);
}

}  // namespace

void router_rows(const RouterRowArgs& a, cudaStream_t s) {
  if (a.T > 0) rows_k<<<token_grid(a.T), kRowThreads, 0, s>>>(a);
}

void router_mask_ids(const int32_t* idx, const int32_t* kept, int32_t* ids_out, int64_t n, cudaStream_t s) {
  if (n > 0) mask_ids_k<<<grid_for(n), kThreads, 0, s>>>(idx, kept, ids_out, n);
}

void router_expert_counts(const int32_t* ids, int64_t n, int64_t E, double* counts_E, cudaStream_t s) {
  if (E > 0) expert_counts_k<<<static_cast<unsigned>(E), kThreads, 0, s>>>(ids, n, counts_E);
}

void router_aux_counts(const float* a, const int32_t* top, int64_t T, int64_t E, int64_t K, int64_t G, double* cnt,
                       double* agg, cudaStream_t s) {
  if (G * E > 0) aux_counts_k<<<static_cast<unsigned>(G * E), kThreads, 0, s>>>(a, top, T, E, K, G, cnt, agg);
}

void router_add_class_coef(float* d, const float* coef, int64_t T, int64_t E, int64_t G, cudaStream_t s) {
  if (T * E > 0) add_class_coef_k<<<grid_for(T * E), kThreads, 0, s>>>(d, coef, T, E, G);
}

void router_sum_f64(const double* v, int64_t n, double* out, cudaStream_t s) {
  sum_f64_k<<<1, kThreads, 0, s>>>(v, n, out);
}

void router_mul(float* a, const float* u, int64_t n, cudaStream_t s) {
  if (n > 0) mul_k<<<grid_for(n), kThreads, 0, s>>>(a, u, n);
}

void router_score_backward(const float* dP, const int32_t* idx, const int32_t* kept, const float* p,
                           const float* scores, bool sigmoid, bool pre_softmax, float scale, int64_t T, int64_t E,
                           int64_t K, float* dl, cudaStream_t s) {
  if (T > 0)
    score_backward_k<<<token_grid(T), kRowThreads, 0, s>>>(dP, idx, kept, p, scores, sigmoid, pre_softmax, scale, T, E,
                                                           K, dl);
}

void router_aux_score_backward(bool sigmoid, const float* used, const float* a, const float* da, float* dl, int64_t T,
                               int64_t E, float scale, cudaStream_t s) {
  if (T > 0) aux_score_backward_k<<<token_grid(T), kRowThreads, 0, s>>>(sigmoid, used, a, da, dl, T, E, scale);
}

void router_z_loss_backward(const float* logits, const float* lse, float f, int64_t T, int64_t E, float* dl,
                            cudaStream_t s) {
  if (T * E > 0) z_loss_backward_k<<<grid_for(T * E), kThreads, 0, s>>>(logits, lse, f, T, E, dl);
}

// Capacity dropping (see launch_routing.h): one block per expert. The block first
// gathers the expert's assignments in token order with a block-wide scan (integers: the order is exact), then ranks
// each one by the CPU router's rule (kernels/cpu/routing.cpp capacity_impl), then applies the decisions. A token
// holds at most one assignment per expert (top-k picks distinct experts), so an expert has at most T of them.

namespace {

// Inclusive scans of two flags over the block (Hillis–Steele in shared memory).
__device__ void scan2(int* a, int* b) {
  for (int off = 1; off < blockDim.x; off <<= 1) {
    const int x = threadIdx.x >= off ? a[threadIdx.x - off] : 0;
    const int y = threadIdx.x >= off ? b[threadIdx.x - off] : 0;
    __syncthreads();
    a[threadIdx.x] += x;
    b[threadIdx.x] += y;
    __syncthreads();
  }
}

__global__ void capacity_k(const int32_t* idx, float* P, int32_t* kept, int64_t T, int64_t K, int64_t C,
                           bool by_position, bool pad, int32_t* list, int32_t* work) {
  __shared__ int sa[kThreads], sb[kThreads];
  const int64_t e = blockIdx.x, TK = T * K;
  int32_t* L = list + e * T;  // assignment index t·K + j, ascending
  int32_t* W = work + e * T;  // positive assignments before it in L, then the drop decision
  int64_t n = 0, npos = 0;
  // 1. Gather, in token order, with the count of positive-probability assignments before each.
  for (int64_t base = 0; base < TK; base += blockDim.x) {
    const int64_t i = base + threadIdx.x;
    const int f = i < TK && idx[i] == e;
    const int fp = f && P[i] > 0.0f;
    sa[threadIdx.x] = f;
    sb[threadIdx.x] = fp;
    __syncthreads();
    scan2(sa, sb);
    if (f) {
      const int64_t r = n + sa[threadIdx.x] - 1;
      if (r < T) {
        L[r] = static_cast<int32_t>(i);
        W[r] = static_cast<int32_t>(npos + sb[threadIdx.x] - fp);
      }
    }
    n += sa[blockDim.x - 1];
    npos += sb[blockDim.x - 1];
    __syncthreads();
  }
  if (n > T) n = T;  // cannot happen (distinct picks per token); keeps the scratch in bounds
  // 2. Decide (reads only; each thread writes the W entries it alone reads).
  for (int64_t r = threadIdx.x; r < n; r += blockDim.x) {
    const int64_t i = L[r];
    bool drop;
    if (by_position) {  // routed tokens first, earliest first
      drop = r >= C;
    } else if (npos > C) {  // the C largest probabilities, ties to the earlier token; every zero one is dropped
      const float pi = P[i];
      int64_t rank = 0;
      for (int64_t q = 0; q < n && rank < C; q++) {
        const float pq = P[L[q]];
        rank += pq > pi || (pq == pi && q < r);
      }
      drop = rank >= C;
    } else if (P[i] > 0.0f) {  // every positive one is kept
      drop = false;
    } else {  // a zero one ranks after the positive ones, in token order among the zero (or padding) ones
      const int64_t pos_before = W[r], t = i / K;
      const int64_t rank = npos + (pad ? t - pos_before : r - pos_before);
      drop = rank >= C;
    }
    W[r] = drop ? 1 : 0;
  }
  __syncthreads();
  // 3. Apply.
  for (int64_t r = threadIdx.x; r < n; r += blockDim.x)
    if (W[r]) {
      kept[L[r]] = 0;
      P[L[r]] = 0.0f;
    }
}

}  // namespace

void router_capacity(const int32_t* idx, float* probs, int32_t* kept, int64_t T, int64_t E, int64_t K, int64_t C,
                     bool by_position, bool pad, int32_t* list_ET, int32_t* work_ET, cudaStream_t s) {
  if (E > 0 && T > 0)
    capacity_k<<<static_cast<unsigned>(E), kThreads, 0, s>>>(idx, probs, kept, T, K, C, by_position, pad, list_ET,
                                                             work_ET);
}

}  // namespace moecore::launch
