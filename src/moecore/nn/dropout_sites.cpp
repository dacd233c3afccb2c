// Hidden dropout sites (see dropout.h): the kernel applied with the shard's sequence offset.
#include "moecore/nn/dropout_sites.h"

#include "moecore/core/rng.h"

namespace moecore::nn {

uint64_t HiddenDropout::stream_of(const std::string& site) {
  return stream_id(site);
}

void HiddenDropout::forward_(Tensor& x_SBH, const DropoutBatch& d) const {
  if (!on(d)) return;
  const int64_t rows = x_SBH.dim(0);
  d.seq.runs(tp_.rank() * rows, rows, rows * tp_.size(), [&](int64_t r, int64_t p, int64_t n) {
    Tensor part = x_SBH.slice(r - tp_.rank() * rows, n);
    kernels::dropout_forward(part, mask(d.seed), d.sample_B, p, part);
  });
}

Tensor HiddenDropout::backward(const Tensor& dy_SBH, const DropoutBatch& d) const {
  if (!on(d)) return dy_SBH;
  Tensor dx = Tensor::empty(dy_SBH.shape(), dy_SBH.dtype(), dy_SBH.device());
  const int64_t rows = dy_SBH.dim(0);
  d.seq.runs(tp_.rank() * rows, rows, rows * tp_.size(), [&](int64_t r, int64_t p, int64_t n) {
    Tensor part = dx.slice(r - tp_.rank() * rows, n);
    kernels::dropout_backward(dy_SBH.slice(r - tp_.rank() * rows, n), mask(d.seed), d.sample_B, p, part);
  });
  return dx;
}

}  // namespace moecore::nn
