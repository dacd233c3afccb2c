// Tiled causal GQA attention (see attention.h).
//
// Forward, per (b, h, query tile), over key tiles j ≤ diagonal, with s = scale·q·kᵀ:
//   m' = max(m, max_j s_j);  α = exp(m − m');  p_j = exp(s_j − m');  l = α·l + Σ p_j;  acc = α·acc + Σ p_j·v_j
//   o = acc / l;  lse = m + log l
// Backward, with P = exp(s − lse), Δ_i = Σ_d dO_id·O_id:
//   dV = Pᵀ·dO;  dP = dO·Vᵀ;  dS = P ⊙ (dP − Δ);  dQ = scale·dS·K;  dK = scale·dSᵀ·Q
// With attention dropout (multipliers Z, regenerated per row and key tile): acc sums (p ⊙ Z)·v while l sums the
// undropped p; backward dV = (P ⊙ Z)ᵀ·dO and dS = P ⊙ (Z ⊙ dP − Δ).
// Pass 1 owns a key tile of one kv head and loops over the query heads of its group and query tiles (dK, dV);
// pass 2 owns a query tile and loops over key tiles (dQ). Each output element has exactly one writer.
#include "moecore/kernels/cpu/attention.h"

#include <omp.h>

#include <cmath>
#include <limits>

#include "moecore/core/cpu.h"
#include "moecore/kernels/cpu/vec_math.h"

namespace moecore::kernels {

AttentionDims attention_dims(const Tensor& q, const Tensor& k, const Tensor& v) {
  MOE_ASSERT_MSG(q.ndim() == 4 && k.ndim() == 4, "attention wants [S, B, N, D], got q {} k {}", q.shape().str(),
                 k.shape().str());
  AttentionDims d{q.dim(0), q.dim(1), q.dim(2), k.dim(2), q.dim(3)};
  MOE_ASSERT_SHAPE(k, {d.S, d.B, d.Nkv, d.D});
  MOE_ASSERT_SHAPE(v, {d.S, d.B, d.Nkv, d.D});
  MOE_ASSERT_MSG(d.Nkv > 0 && d.Nq % d.Nkv == 0, "query heads {} not a multiple of kv heads {}", d.Nq, d.Nkv);
  MOE_ASSERT(q.dtype() == k.dtype() && q.dtype() == v.dtype());
  return d;
}

AttentionDims attention_forward_dims(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                                     const Tensor& lse) {
  const AttentionDims d = attention_dims(q, k, v);
  MOE_ASSERT(o.shape() == q.shape() && o.dtype() == q.dtype() && lse.dtype() == q.dtype());
  MOE_ASSERT_SHAPE(lse, {d.B, d.Nq, d.S});
  return d;
}

AttentionDims attention_backward_dims(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                                      const Tensor& o, const Tensor& lse, const Tensor& dq, const Tensor& dk,
                                      const Tensor& dv) {
  const AttentionDims d = attention_dims(q, k, v);
  MOE_ASSERT(dout.shape() == q.shape() && o.shape() == q.shape() && dq.shape() == q.shape());
  MOE_ASSERT(dk.shape() == k.shape() && dv.shape() == v.shape());
  MOE_ASSERT_SHAPE(lse, {d.B, d.Nq, d.S});
  return d;
}

namespace {

// Copies `n` rows of length D from a strided source into a dense [n, D] tile, scaled.
template <typename T>
inline void load_rows(T* dst, const T* src, int64_t stride, int64_t n, int64_t D, T scale = T(1)) {
  for (int64_t r = 0; r < n; r++)
    for (int64_t d = 0; d < D; d++) dst[r * D + d] = src[r * stride + d] * scale;
}

// Transposed copy into [D, Bc] (columns = rows of the source), so row-times-tile products vectorize over keys.
template <typename T>
inline void load_rows_t(T* dst, const T* src, int64_t stride, int64_t n, int64_t D) {
  for (int64_t r = 0; r < n; r++)
    for (int64_t d = 0; d < D; d++) dst[d * kAttnTile + r] = src[r * stride + d];
}

// out[0..nc) = Σ_d a[d] · bt[d][0..nc)   (one query row against a transposed key/value tile)
// The accumulator spans the whole tile width, a compile-time constant, so it lives in vector registers across the
// d loop instead of being loaded and stored per term; columns past nc are computed and ignored.
template <typename T>
inline void row_times_tile(T* out, const T* a, const T* bt, int64_t nc, int64_t D) {
  T acc[kAttnTile] = {};
  for (int64_t d = 0; d < D; d++) {
    const T ad = a[d];
    const T* b = bt + d * kAttnTile;
    for (int64_t j = 0; j < kAttnTile; j++) acc[j] += ad * b[j];
  }
  for (int64_t j = 0; j < nc; j++) out[j] = acc[j];
}

template <typename T>
MOE_TARGET_CLONES void forward_impl(const AttentionDims& dm, const T* q, const T* k, const T* v, T* o, T* lse, T scale,
                                    T* scratch, int64_t per_thread, const AttentionDropout* drop) {
  const int64_t S = dm.S, D = dm.D, nt = dm.ntiles(), group = dm.Nq / dm.Nkv;
  const int64_t items = dm.B * dm.Nq * nt;
  _Pragma("omp parallel for schedule(dynamic, 1)") for (int64_t it = 0; it < items; it++) {
    const int64_t qt = it % nt, h = (it / nt) % dm.Nq, b = it / (nt * dm.Nq);
    const int64_t g = h / group;
    T* Q = scratch + omp_get_thread_num() * per_thread;  // [Br, D] pre-scaled
    T* KT = Q + kAttnTile * D;                           // [D, Bc]
    T* V = KT + kAttnTile * D;                           // [Bc, D]
    T* acc = V + kAttnTile * D;                          // [Br, D]
    T* s = acc + kAttnTile * D;                          // [Bc]
    T* m = s + kAttnTile;                                // [Br]
    T* l = m + kAttnTile;                                // [Br]
    T* z = l + kAttnTile;                                // [Bc] dropout multipliers
    const int64_t i0 = qt * kAttnTile, nr = std::min(kAttnTile, S - i0);
    load_rows(Q, q + i0 * dm.q_row() + (b * dm.Nq + h) * D, dm.q_row(), nr, D, scale);
    for (int64_t i = 0; i < nr; i++) {
      m[i] = -std::numeric_limits<T>::infinity();
      l[i] = 0;
    }
    for (int64_t i = 0; i < nr * D; i++) acc[i] = 0;
    for (int64_t kt = 0; kt <= qt; kt++) {
      const int64_t j0 = kt * kAttnTile, nc = std::min(kAttnTile, S - j0);
      const T* kbase = k + j0 * dm.kv_row() + (b * dm.Nkv + g) * D;
      const T* vbase = v + j0 * dm.kv_row() + (b * dm.Nkv + g) * D;
      load_rows_t(KT, kbase, dm.kv_row(), nc, D);
      load_rows(V, vbase, dm.kv_row(), nc, D);
      for (int64_t i = 0; i < nr; i++) {
        const int64_t jmax = std::min(nc, i0 + i - j0 + 1);  // keys j0..j0+jmax-1 are visible (causal)
        if (jmax <= 0) continue;
        row_times_tile(s, Q + i * D, KT, jmax, D);
        T mx = m[i];
#pragma omp simd reduction(max : mx)
        for (int64_t j = 0; j < jmax; j++) mx = s[j] > mx ? s[j] : mx;
        const T alpha = std::exp(m[i] - mx);
        T sum = 0;
#pragma omp simd reduction(+ : sum)
        for (int64_t j = 0; j < jmax; j++) {
          s[j] = vexp(s[j] - mx);
          sum += s[j];
        }
        l[i] = l[i] * alpha + sum;
        m[i] = mx;
        if (drop) {
          drop->row(b, h, i0 + i, j0, jmax, z);
          for (int64_t j = 0; j < jmax; j++) s[j] *= z[j];
        }
        T* a = acc + i * D;
        for (int64_t d = 0; d < D; d++) a[d] *= alpha;
        for (int64_t j = 0; j < jmax; j++) {
          const T p = s[j];
          const T* vr = V + j * D;
          for (int64_t d = 0; d < D; d++) a[d] += p * vr[d];
        }
      }
    }
    T* obase = o + i0 * dm.q_row() + (b * dm.Nq + h) * D;
    T* lrow = lse + (b * dm.Nq + h) * S + i0;
    for (int64_t i = 0; i < nr; i++) {
      const T inv = T(1) / l[i];
      for (int64_t d = 0; d < D; d++) obase[i * dm.q_row() + d] = acc[i * D + d] * inv;
      lrow[i] = m[i] + std::log(l[i]);
    }
  }
}

// Recomputes one query row's probabilities p[j] (times the dropout multipliers, for dV) and dS[j] against a key
// tile. Returns the visible key count.
template <typename T>
inline int64_t row_probs(T* p, T* ds, T* z, const T* qrow, const T* dorow, const T* KT, const T* VT,
                         const AttentionDropout* drop, int64_t b, int64_t h, int64_t i_global, int64_t j0, int64_t nc,
                         int64_t D, T scale, T lse_i, T delta_i) {
  const int64_t jmax = std::min(nc, i_global - j0 + 1);
  if (jmax <= 0) return 0;
  row_times_tile(p, qrow, KT, jmax, D);
  row_times_tile(ds, dorow, VT, jmax, D);
  if (drop) {
    drop->row(b, h, i_global, j0, jmax, z);
#pragma omp simd
    for (int64_t j = 0; j < jmax; j++) {
      const T pj = vexp(p[j] * scale - lse_i);
      ds[j] = pj * (ds[j] * z[j] - delta_i);
      p[j] = pj * z[j];
    }
    return jmax;
  }
#pragma omp simd
  for (int64_t j = 0; j < jmax; j++) {
    p[j] = vexp(p[j] * scale - lse_i);
    ds[j] = p[j] * (ds[j] - delta_i);
  }
  return jmax;
}

template <typename T>
MOE_TARGET_CLONES void backward_impl(const AttentionDims& dm, const T* dout, const T* q, const T* k, const T* v,
                                     const T* lse, const T* delta, T* dq, T* dk, T* dv, T scale, T* scratch,
                                     int64_t per_thread, const AttentionDropout* drop) {
  const int64_t S = dm.S, D = dm.D, nt = dm.ntiles(), group = dm.Nq / dm.Nkv;
  // Pass 1: dK, dV per (b, kv head g, key tile).
  const int64_t items1 = dm.B * dm.Nkv * nt;
  _Pragma("omp parallel for schedule(dynamic, 1)") for (int64_t it = 0; it < items1; it++) {
    const int64_t kt = it % nt, g = (it / nt) % dm.Nkv, b = it / (nt * dm.Nkv);
    T* KT = scratch + omp_get_thread_num() * per_thread;  // [D, Bc]
    T* VT = KT + kAttnTile * D;                           // [D, Bc]
    T* dK = VT + kAttnTile * D;                           // [Bc, D]
    T* dV = dK + kAttnTile * D;                           // [Bc, D]
    T* p = dV + kAttnTile * D;                            // [Bc]
    T* ds = p + kAttnTile;                                // [Bc]
    T* z = ds + kAttnTile;                                // [Bc]
    const int64_t j0 = kt * kAttnTile, nc = std::min(kAttnTile, S - j0);
    const T* kbase = k + j0 * dm.kv_row() + (b * dm.Nkv + g) * D;
    const T* vbase = v + j0 * dm.kv_row() + (b * dm.Nkv + g) * D;
    load_rows_t(KT, kbase, dm.kv_row(), nc, D);
    load_rows_t(VT, vbase, dm.kv_row(), nc, D);
    for (int64_t i = 0; i < nc * D; i++) dK[i] = dV[i] = 0;
    for (int64_t h = g * group; h < (g + 1) * group; h++) {
      const T* lrow = lse + (b * dm.Nq + h) * S;
      const T* drow = delta + (b * dm.Nq + h) * S;
      for (int64_t i = j0; i < S; i++) {  // queries at or after the first key of the tile
        const T* qrow = q + i * dm.q_row() + (b * dm.Nq + h) * D;
        const T* dorow = dout + i * dm.q_row() + (b * dm.Nq + h) * D;
        const int64_t jmax =
            row_probs(p, ds, z, qrow, dorow, KT, VT, drop, b, h, i, j0, nc, D, scale, lrow[i], drow[i]);
        for (int64_t j = 0; j < jmax; j++) {
          const T pj = p[j], dsj = ds[j] * scale;
          T* dvr = dV + j * D;
          T* dkr = dK + j * D;
          for (int64_t d = 0; d < D; d++) {
            dvr[d] += pj * dorow[d];
            dkr[d] += dsj * qrow[d];
          }
        }
      }
    }
    T* dkbase = dk + j0 * dm.kv_row() + (b * dm.Nkv + g) * D;
    T* dvbase = dv + j0 * dm.kv_row() + (b * dm.Nkv + g) * D;
    for (int64_t j = 0; j < nc; j++)
      for (int64_t d = 0; d < D; d++) {
        dkbase[j * dm.kv_row() + d] = dK[j * D + d];
        dvbase[j * dm.kv_row() + d] = dV[j * D + d];
      }
  }
  // Pass 2: dQ per (b, h, query tile).
  const int64_t items2 = dm.B * dm.Nq * nt;
  _Pragma("omp parallel for schedule(dynamic, 1)") for (int64_t it = 0; it < items2; it++) {
    const int64_t qt = it % nt, h = (it / nt) % dm.Nq, b = it / (nt * dm.Nq);
    const int64_t g = h / group;
    T* KT = scratch + omp_get_thread_num() * per_thread;  // [D, Bc]
    T* VT = KT + kAttnTile * D;                           // [D, Bc]
    T* K = VT + kAttnTile * D;                            // [Bc, D]
    T* dQ = K + kAttnTile * D;                            // [Br, D]
    T* p = dQ + kAttnTile * D;
    T* ds = p + kAttnTile;
    T* z = ds + kAttnTile;
    const int64_t i0 = qt * kAttnTile, nr = std::min(kAttnTile, S - i0);
    const T* lrow = lse + (b * dm.Nq + h) * S;
    const T* drow = delta + (b * dm.Nq + h) * S;
    for (int64_t i = 0; i < nr * D; i++) dQ[i] = 0;
    for (int64_t kt = 0; kt <= qt; kt++) {
      const int64_t j0 = kt * kAttnTile, nc = std::min(kAttnTile, S - j0);
      const T* kbase = k + j0 * dm.kv_row() + (b * dm.Nkv + g) * D;
      const T* vbase = v + j0 * dm.kv_row() + (b * dm.Nkv + g) * D;
      load_rows_t(KT, kbase, dm.kv_row(), nc, D);
      load_rows_t(VT, vbase, dm.kv_row(), nc, D);
      load_rows(K, kbase, dm.kv_row(), nc, D);
      for (int64_t i = 0; i < nr; i++) {
        const int64_t ig = i0 + i;
        const T* qrow = q + ig * dm.q_row() + (b * dm.Nq + h) * D;
        const T* dorow = dout + ig * dm.q_row() + (b * dm.Nq + h) * D;
        const int64_t jmax =
            row_probs(p, ds, z, qrow, dorow, KT, VT, drop, b, h, ig, j0, nc, D, scale, lrow[ig], drow[ig]);
        T* dqr = dQ + i * D;
        for (int64_t j = 0; j < jmax; j++) {
          const T dsj = ds[j] * scale;
          const T* kr = K + j * D;
          for (int64_t d = 0; d < D; d++) dqr[d] += dsj * kr[d];
        }
      }
    }
    T* dqbase = dq + i0 * dm.q_row() + (b * dm.Nq + h) * D;
    for (int64_t i = 0; i < nr; i++)
      for (int64_t d = 0; d < D; d++) dqbase[i * dm.q_row() + d] = dQ[i * D + d];
  }
}

}  // namespace

void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, double scale, Tensor& o, Tensor& lse,
                       const AttentionDropout* dropout) {
  const AttentionDims dm = attention_forward_dims(q, k, v, o, lse);
  if (dropout && !dropout->on()) dropout = nullptr;
  const int64_t per_thread = 4 * kAttnTile * dm.D + 4 * kAttnTile;
  Tensor scratch = Tensor::zeros({num_threads(), per_thread}, q.dtype());  // tiles are read full width
  MOE_DISPATCH_FLOAT(q.dtype(), T, {
    forward_impl<T>(dm, q.data<T>(), k.data<T>(), v.data<T>(), o.data<T>(), lse.data<T>(), T(scale), scratch.data<T>(),
                    per_thread, dropout);
  });
}

void attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                        const Tensor& lse, double scale, Tensor& dq, Tensor& dk, Tensor& dv,
                        const AttentionDropout* dropout) {
  const AttentionDims dm = attention_backward_dims(dout, q, k, v, o, lse, dq, dk, dv);
  if (dropout && !dropout->on()) dropout = nullptr;
  const int64_t per_thread = 4 * kAttnTile * dm.D + 3 * kAttnTile;
  Tensor scratch = Tensor::zeros({num_threads(), per_thread}, q.dtype());  // tiles are read full width
  Tensor delta = Tensor::empty({dm.B, dm.Nq, dm.S}, q.dtype());
  MOE_DISPATCH_FLOAT(q.dtype(), T, {
    const T* od = o.data<T>();
    const T* dod = dout.data<T>();
    T* dl = delta.data<T>();
    const int64_t rows = dm.B * dm.Nq;
    _Pragma("omp parallel for schedule(static)") for (int64_t r = 0; r < rows; r++) for (int64_t i = 0; i < dm.S; i++) {
      const int64_t off = i * dm.q_row() + r * dm.D;  // r = b·Nq + h matches the [S, B, Nq, D] layout
      T s = 0;
      for (int64_t d = 0; d < dm.D; d++) s += dod[off + d] * od[off + d];
      dl[r * dm.S + i] = s;
    }
    backward_impl<T>(dm, dod, q.data<T>(), k.data<T>(), v.data<T>(), lse.data<T>(), dl, dq.data<T>(), dk.data<T>(),
                     dv.data<T>(), T(scale), scratch.data<T>(), per_thread, dropout);
  });
}

}  // namespace moecore::kernels
