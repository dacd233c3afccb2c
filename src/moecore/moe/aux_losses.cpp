// Load-balancing losses and z-loss (see aux_losses.h). Counts and sums are accumulated in f64 in a fixed order, so
// every layout that holds the same tokens gets the same bits.
#include "moecore/moe/aux_losses.h"

#include <algorithm>
#include <cmath>

namespace moecore::moe {

int64_t group_size(const comm::ProcessGroup* g) {
  return g ? g->size() : 1;
}

namespace {

// Sums counts over the group (f64, exact for counts).
void sum_over_group(Tensor& counts, const comm::ProcessGroup* g) {
  if (g && g->size() > 1) g->all_reduce(counts);
}

// cnt[e] = Σ_t [e ∈ top_t] and agg[e] = Σ_t a_te over this rank's tokens (f64).
template <typename R>
void count_and_sum(const R* a, const int32_t* top, int64_t T, int64_t E, int64_t K, double* cnt, double* agg) {
  std::fill(cnt, cnt + E, 0.0);
  std::fill(agg, agg + E, 0.0);
  for (int64_t t = 0; t < T; t++) {
    for (int64_t j = 0; j < K; j++) cnt[top[t * K + j]] += 1;
    for (int64_t e = 0; e < E; e++) agg[e] += a[t * E + e];
  }
}

void check_shapes(const Tensor& a_TE, const Tensor& top_TK, const Tensor& da_TE) {
  MOE_ASSERT(a_TE.ndim() == 2 && top_TK.ndim() == 2 && top_TK.dim(0) == a_TE.dim(0));
  MOE_ASSERT(top_TK.dtype() == DType::I32 && da_TE.dtype() == a_TE.dtype() && da_TE.numel() == a_TE.numel());
}

// L = f·Σ_e agg_e·c_e and da_te += g·c_e (g = grad_scale·f), the form aux_loss and global_aux_loss share.
template <typename R>
double batch_loss(const double* agg, const double* c, double f, double g, bool scaled, int64_t T, int64_t E, R* d) {
  double L = 0;
  for (int64_t e = 0; e < E; e++) L += agg[e] * c[e] * f;
  for (int64_t t = 0; t < T; t++)
    for (int64_t e = 0; e < E; e++) d[t * E + e] += static_cast<R>(scaled ? g * f * c[e] : f * c[e]);
  return L;
}

}  // namespace

double aux_loss(const Tensor& a_TE, const Tensor& top_TK, double coeff, const comm::ProcessGroup* count_group,
                Tensor& da_TE) {
  if (a_TE.device().is_cuda()) return aux_loss_gpu(a_TE, top_TK, coeff, count_group, da_TE);
  check_shapes(a_TE, top_TK, da_TE);
  const int64_t T = a_TE.dim(0), E = a_TE.dim(1), K = top_TK.dim(1);
  Tensor cnt = Tensor::empty({E}, DType::F64), agg = Tensor::empty({E}, DType::F64);
  double L = 0;
  MOE_DISPATCH_FLOAT(a_TE.dtype(), R, {
    count_and_sum(a_TE.data<R>(), top_TK.data<int32_t>(), T, E, K, cnt.data<double>(), agg.data<double>());
    sum_over_group(cnt, count_group);
    const double Tt = static_cast<double>(T * group_size(count_group));  // the group's tokens
    const double f = coeff * E / (K * Tt * Tt);
    L = batch_loss(agg.data<double>(), cnt.data<double>(), f, 1.0, false, T, E, da_TE.data<R>());
  });
  return L;
}

double seq_aux_loss(const Tensor& a_TE, const Tensor& top_TK, int64_t S, int64_t B, double coeff,
                    const comm::ProcessGroup* count_group, Tensor& da_TE) {
  if (a_TE.device().is_cuda()) return seq_aux_loss_gpu(a_TE, top_TK, S, B, coeff, count_group, da_TE);
  check_shapes(a_TE, top_TK, da_TE);
  const int64_t T = a_TE.dim(0), E = a_TE.dim(1), K = top_TK.dim(1);
  MOE_ASSERT(T == S * B);
  Tensor cnt_t = Tensor::zeros({B * E}, DType::F64), agg_t = Tensor::zeros({B * E}, DType::F64);
  double L = 0;
  MOE_DISPATCH_FLOAT(a_TE.dtype(), R, {
    const R* a = a_TE.data<R>();
    const int32_t* top = top_TK.data<int32_t>();
    double* cnt = cnt_t.data<double>();
    double* agg = agg_t.data<double>();
    for (int64_t t = 0; t < T; t++) {
      const int64_t b = t % B;
      for (int64_t j = 0; j < K; j++) cnt[b * E + top[t * K + j]] += 1;
      for (int64_t e = 0; e < E; e++) agg[b * E + e] += a[t * E + e];
    }
    sum_over_group(cnt_t, count_group);
    const double St = static_cast<double>(S * group_size(count_group));  // the whole sequence
    const double f = coeff * E / (K * St * St * B);
    for (int64_t i = 0; i < B * E; i++) L += agg[i] * cnt[i] * f;
    R* d = da_TE.data<R>();
    for (int64_t t = 0; t < T; t++)
      for (int64_t e = 0; e < E; e++) d[t * E + e] += static_cast<R>(f * cnt[(t % B) * E + e]);
  });
  return L;
}

double global_aux_loss(const Tensor& a_TE, const Tensor& top_TK, double coeff, const comm::ProcessGroup* global_group,
                       double grad_scale, GlobalAuxCounts& acc, Tensor& da_TE) {
  if (a_TE.device().is_cuda()) return global_aux_loss_gpu(a_TE, top_TK, coeff, global_group, grad_scale, acc, da_TE);
  check_shapes(a_TE, top_TK, da_TE);
  const int64_t T = a_TE.dim(0), E = a_TE.dim(1), K = top_TK.dim(1);
  MOE_ASSERT(acc.tokens_E.numel() == E && acc.tokens_E.dtype() == DType::F64);
  Tensor cnt_t = Tensor::empty({E}, DType::F64), agg = Tensor::empty({E}, DType::F64);
  double L = 0;
  MOE_DISPATCH_FLOAT(a_TE.dtype(), R, {
    double* cnt = cnt_t.data<double>();
    count_and_sum(a_TE.data<R>(), top_TK.data<int32_t>(), T, E, K, cnt, agg.data<double>());
    sum_over_group(cnt_t, global_group);
    // c̄ = running mean of the global counts over this global batch's micro-batches.
    double* g = acc.tokens_E.data<double>();
    acc.micro_batches++;
    for (int64_t e = 0; e < E; e++) {
      g[e] += cnt[e];
      cnt[e] = g[e] / static_cast<double>(acc.micro_batches);
    }
    const double Tt = static_cast<double>(T * group_size(global_group));
    const double f = coeff * E / (K * Tt * Tt);
    L = batch_loss(agg.data<double>(), cnt, f, grad_scale, true, T, E, da_TE.data<R>());
  });
  return L;
}

double z_loss(const Tensor& logits_TE, double coeff, int64_t ranks, Tensor& lse_T) {
  const int64_t T = logits_TE.dim(0), E = logits_TE.dim(1);
  MOE_ASSERT(lse_T.numel() == T && lse_T.dtype() == logits_TE.dtype());
  double z = 0;
  MOE_DISPATCH_FLOAT(logits_TE.dtype(), R, {
    const R* l = logits_TE.data<R>();
    R* lse = lse_T.data<R>();
    for (int64_t t = 0; t < T; t++) {
      R mx = l[t * E];
      for (int64_t e = 1; e < E; e++) mx = std::max(mx, l[t * E + e]);
      R s = 0;
      for (int64_t e = 0; e < E; e++) s += std::exp(l[t * E + e] - mx);
      lse[t] = mx + std::log(s);
      z += static_cast<double>(lse[t]) * lse[t];
    }
  });
  return coeff * z / static_cast<double>(T * ranks);  // coeff/#(TP×CP) · local mean
}

void z_loss_backward(const Tensor& logits_TE, const Tensor& lse_T, double coeff, int64_t ranks, double grad_scale,
                     Tensor& dlogits_TE) {
  const int64_t T = logits_TE.dim(0), E = logits_TE.dim(1);
  MOE_ASSERT(dlogits_TE.numel() == T * E && dlogits_TE.dtype() == logits_TE.dtype() && lse_T.numel() == T);
  MOE_DISPATCH_FLOAT(logits_TE.dtype(), R, {
    // z = coeff/T · Σ_t lse_t²:  dl_te = coeff · 2·lse_t/T · exp(l_te − lse_t)
    const R* l = logits_TE.data<R>();
    const R* lse = lse_T.data<R>();
    R* d = dlogits_TE.data<R>();
    const R f = R(grad_scale * coeff * 2.0 / static_cast<double>(T * ranks));
    for (int64_t t = 0; t < T; t++)
      for (int64_t e = 0; e < E; e++) d[t * E + e] += f * lse[t] * std::exp(l[t * E + e] - lse[t]);
  });
}

}  // namespace moecore::moe
