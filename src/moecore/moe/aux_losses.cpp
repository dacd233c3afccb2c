// Load-balancing losses and z-loss (see aux_losses.h). Counts and sums are accumulated in f64 in a fixed order (by
// kernels::router_aux_counts), so every layout that holds the same tokens gets the same bits.
#include "moecore/moe/aux_losses.h"

#include "moecore/kernels/routing.h"

namespace moecore::moe {

int64_t group_size(const comm::ProcessGroup* g) {
  return g ? g->size() : 1;
}

namespace {

// The counts c and aux-score sums agg of each of G token classes (t mod G) and expert, [G·E] f64 on the host, the
// counts summed over the group (f64, exact for counts).
struct ClassCounts {
  Tensor cnt, agg;
};

ClassCounts class_counts(const Tensor& a_TE, const Tensor& top_TK, int64_t G, const comm::ProcessGroup* group,
                         const Tensor& da_TE) {
  MOE_ASSERT(a_TE.ndim() == 2 && top_TK.ndim() == 2 && top_TK.dim(0) == a_TE.dim(0));
  MOE_ASSERT(top_TK.dtype() == DType::I32 && da_TE.dtype() == a_TE.dtype() && da_TE.numel() == a_TE.numel());
  const int64_t n = G * a_TE.dim(1);
  Tensor cnt = Tensor::empty({n}, DType::F64, a_TE.device()), agg = Tensor::empty({n}, DType::F64, a_TE.device());
  kernels::router_aux_counts(a_TE, top_TK, G, cnt, agg);
  ClassCounts c{cnt.to(Device::cpu()), agg.to(Device::cpu())};
  if (group && group->size() > 1) group->all_reduce(c.cnt);
  return c;
}

// The form every load-balancing loss takes: L = f·Σ_i agg_i·c_i over the classes, and da_te += g·f·c_{class(t), e}
// (g = grad_scale), the coefficients rounded to da's dtype once on the host.
double class_loss(const ClassCounts& c, double f, double g, Tensor& da_TE) {
  const int64_t n = c.cnt.numel();
  const double* cnt = c.cnt.data<double>();
  const double* agg = c.agg.data<double>();
  double L = 0;
  for (int64_t i = 0; i < n; i++) L += agg[i] * cnt[i] * f;
  Tensor coef = Tensor::empty({n}, DType::F64);
  double* k = coef.data<double>();
  for (int64_t i = 0; i < n; i++) k[i] = g * f * cnt[i];
  kernels::router_add_class_coef(da_TE, coef.to(da_TE.dtype()).to(da_TE.device()));
  return L;
}

}  // namespace

double aux_loss(const Tensor& a_TE, const Tensor& top_TK, double coeff, const comm::ProcessGroup* count_group,
                Tensor& da_TE) {
  const int64_t T = a_TE.dim(0), E = a_TE.dim(1), K = top_TK.dim(1);
  const ClassCounts c = class_counts(a_TE, top_TK, 1, count_group, da_TE);
  const double Tt = static_cast<double>(T * group_size(count_group));  // the group's tokens
  const double f = coeff * E / (K * Tt * Tt);
  return class_loss(c, f, 1.0, da_TE);
}

double seq_aux_loss(const Tensor& a_TE, const Tensor& top_TK, int64_t S, int64_t B, double coeff,
                    const comm::ProcessGroup* count_group, Tensor& da_TE) {
  const int64_t T = a_TE.dim(0), E = a_TE.dim(1), K = top_TK.dim(1);
  MOE_ASSERT(T == S * B);
  const ClassCounts c = class_counts(a_TE, top_TK, B, count_group, da_TE);  // token t = s·B + b is in sequence b
  const double St = static_cast<double>(S * group_size(count_group));       // the whole sequence
  const double f = coeff * E / (K * St * St * B);
  return class_loss(c, f, 1.0, da_TE);
}

double global_aux_loss(const Tensor& a_TE, const Tensor& top_TK, double coeff, const comm::ProcessGroup* global_group,
                       double grad_scale, GlobalAuxCounts& acc, Tensor& da_TE) {
  const int64_t T = a_TE.dim(0), E = a_TE.dim(1), K = top_TK.dim(1);
  MOE_ASSERT(acc.tokens_E.numel() == E && acc.tokens_E.dtype() == DType::F64 && acc.tokens_E.device().is_cpu());
  const ClassCounts c = class_counts(a_TE, top_TK, 1, global_group, da_TE);
  // c̄ = running mean of the global counts over this global batch's micro-batches.
  double* cnt = c.cnt.data<double>();
  double* g = acc.tokens_E.data<double>();
  acc.micro_batches++;
  for (int64_t e = 0; e < E; e++) {
    g[e] += cnt[e];
    cnt[e] = g[e] / static_cast<double>(acc.micro_batches);
  }
  const double Tt = static_cast<double>(T * group_size(global_group));
  const double f = coeff * E / (K * Tt * Tt);
  return class_loss(c, f, grad_scale, da_TE);
}

double z_loss(double lse_sq_sum, int64_t T, double coeff, int64_t ranks) {
  return coeff * lse_sq_sum / static_cast<double>(T * ranks);  // coeff/#(TP×CP) · local mean
}

void z_loss_backward(const Tensor& logits_TE, const Tensor& lse_T, double coeff, int64_t ranks, double grad_scale,
                     Tensor& dlogits_TE) {
  // z = coeff/(T·ranks) · Σ_t lse_t²:  dl_te = coeff · 2·lse_t/(T·ranks) · exp(l_te − lse_t), times the grad scale
  const int64_t T = logits_TE.dim(0);
  kernels::router_z_loss_backward(logits_TE, lse_T, grad_scale * coeff * 2.0 / static_cast<double>(T * ranks),
                                  dlogits_TE);
}

}  // namespace moecore::moe
