// Sequence-parallel collectives (see tensor_parallel.h).
#include "moecore/nn/tensor_parallel.h"

namespace moecore::nn {

namespace {
Shape with_leading(const Shape& s, int64_t lead) {
  Shape o = s;
  o.set(0, lead);
  return o;
}
}  // namespace

Tensor sp_all_gather(const Tensor& x, const TPContext& tp) {
  if (!tp.on()) return x;
  Tensor out = Tensor::empty(with_leading(x.shape(), x.dim(0) * tp.size()), x.dtype(), x.device());
  tp.group->all_gather(x, out);
  return out;
}

Tensor sp_reduce_scatter(const Tensor& x, const TPContext& tp) {
  if (!tp.on()) return x;
  MOE_ASSERT_MSG(x.dim(0) % tp.size() == 0, "sequence-parallel reduce-scatter of {} over {} ranks", x.shape().str(),
                 tp.size());
  Tensor out = Tensor::empty(with_leading(x.shape(), x.dim(0) / tp.size()), x.dtype(), x.device());
  tp.group->reduce_scatter(x, out);
  return out;
}

}  // namespace moecore::nn
