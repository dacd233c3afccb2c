// Hidden dropout sites (see dropout.h): the kernel applied with the shard's sequence offset.
#include "moecore/nn/dropout.h"

#include "moecore/core/rng.h"

namespace moecore::nn {

uint64_t HiddenDropout::stream_of(const std::string& site) {
  return stream_id(site);
}

void HiddenDropout::forward_(Tensor& x_SBH, const DropoutBatch& d) const {
  if (!on(d)) return;
  kernels::dropout_forward(x_SBH, mask(d.seed), d.sample_B, tp_.rank() * x_SBH.dim(0), x_SBH);
}

Tensor HiddenDropout::backward(const Tensor& dy_SBH, const DropoutBatch& d) const {
  if (!on(d)) return dy_SBH;
  Tensor dx = Tensor::empty(dy_SBH.shape(), dy_SBH.dtype());
  kernels::dropout_backward(dy_SBH, mask(d.seed), d.sample_B, tp_.rank() * dy_SBH.dim(0), dx);
  return dx;
}

}  // namespace moecore::nn
