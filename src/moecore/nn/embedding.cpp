// Embedding module (see embedding.h).
#include "moecore/nn/embedding.h"

#include "moecore/kernels/cpu/embedding.h"

namespace moecore::nn {

Embedding::Embedding(ParamRegistry& reg, const std::string& name, int64_t vocab, int64_t hidden, double init_std) {
  weight_ = &reg.add(name + ".weight", {vocab, hidden}, InitRule::normal(init_std));
}

Tensor Embedding::forward(const Tensor& ids_T, Stash& st) {
  st.ids_T = ids_T;
  Tensor y = Tensor::empty({ids_T.numel(), weight_->value.dim(1)}, weight_->value.dtype());
  kernels::embedding_forward(ids_T, weight_->value, y);
  return y;
}

void Embedding::backward(const Tensor& dy_TH, Stash& st) {
  kernels::embedding_backward(dy_TH, st.ids_T, weight_->grad);
  st.ids_T = Tensor();
}

}  // namespace moecore::nn
