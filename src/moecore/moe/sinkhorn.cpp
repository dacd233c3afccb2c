// Sinkhorn normalisation for load-balanced top-k selection (see sinkhorn.h).
#include "moecore/moe/sinkhorn.h"

#include <cmath>
#include <vector>

#include "moecore/core/error.h"

namespace moecore::moe {

Tensor sinkhorn_TE(const Tensor& logits_TE, const comm::ProcessGroup* group, double tol) {
  MOE_ASSERT(logits_TE.ndim() == 2);
  const int64_t T = logits_TE.dim(0), E = logits_TE.dim(1);
  const bool shared = group != nullptr && group->size() > 1;
  Tensor out = Tensor::empty({T, E}, DType::F64);
  double* cost = out.data<double>();
  // On the host (a copy of GPU logits): each iteration ends in the group's all-reduce and a convergence test the
  // host reads, and the result is the CPU's bits on either device.
  const Tensor host_TE = logits_TE.to(Device::cpu());
  MOE_DISPATCH_FLOAT(host_TE.dtype(), R, {
    const R* l = host_TE.data<R>();
    for (int64_t i = 0; i < T * E; i++) cost[i] = std::exp(static_cast<double>(l[i]));
  });
  Tensor total = Tensor::empty({1}, DType::F64);  // tokens over the group
  total.set_item(0, static_cast<double>(T));
  if (shared) group->all_reduce(total);
  const double T_all = total.item(0), eps = 1e-8;
  std::vector<double> d0(static_cast<size_t>(T), 1.0);
  Tensor d1 = Tensor::empty({E}, DType::F64), col = Tensor::empty({E}, DType::F64);
  for (int64_t e = 0; e < E; e++) d1.data<double>()[e] = 1.0;
  std::vector<double> d1_old(static_cast<size_t>(E), 1.0);
  for (double error = 1e9; error > tol;) {
    const double* d1p = d1.data<double>();
    for (int64_t t = 0; t < T; t++) {
      double s = 0;
      for (int64_t e = 0; e < E; e++) s += d1p[e] * cost[t * E + e];
      d0[t] = (1.0 / T_all) / (s + eps);
    }
    double* c = col.data<double>();
    for (int64_t e = 0; e < E; e++) c[e] = 0;
    for (int64_t t = 0; t < T; t++)
      for (int64_t e = 0; e < E; e++) c[e] += d0[t] * cost[t * E + e];
    if (shared) group->all_reduce(col);
    double* d1w = d1.data<double>();
    error = 0;
    for (int64_t e = 0; e < E; e++) {
      d1w[e] = (1.0 / static_cast<double>(E)) / (c[e] + eps);
      error += std::fabs(d1_old[e] - d1w[e]);
      d1_old[e] = d1w[e];
    }
    error /= static_cast<double>(E);
  }
  const double* d1p = d1.data<double>();
  for (int64_t t = 0; t < T; t++)
    for (int64_t e = 0; e < E; e++) cost[t * E + e] *= d1p[e] * d0[t];
  return out;
}

}  // namespace moecore::moe
