// Embedding module (see embedding.h).
#include "moecore/nn/vocab_embedding.h"

#include "moecore/kernels/embedding.h"

namespace moecore::nn {

Embedding::Embedding(ParamRegistry& reg, const std::string& name, int64_t vocab, int64_t hidden, double init_std,
                     TPContext tp)
    : tp_(tp), vocab_(vocab) {
  MOE_CHECK(vocab % tp.size() == 0, "the padded vocabulary {} does not split over {} tensor-parallel ranks", vocab,
            tp.size());
  const int64_t local = vocab / tp.size();
  vocab_start_ = tp.rank() * local;
  weight_ = &reg.add(name + ".weight", {local, hidden}, InitRule::normal(init_std));
  if (tp.on()) {
    weight_->set_shard({vocab, hidden}, {vocab_start_, 0}, {local, hidden});
    weight_->tensor_parallel = true;
  }
}

Tensor Embedding::forward(const Tensor& ids_T, Stash& st) {
  st.ids_T = ids_T;
  Tensor y = Tensor::empty({ids_T.numel(), weight_->value.dim(1)}, weight_->value.dtype(), weight_->value.device());
  kernels::embedding_forward(ids_T, weight_->value, y, vocab_start_, vocab_);
  return sp_reduce_scatter(y, tp_);
}

void Embedding::backward(const Tensor& dy_TH, Stash& st) {
  kernels::embedding_backward(sp_all_gather(dy_TH, tp_), st.ids_T, weight_->grad_to_add(), vocab_start_);
  st.ids_T = Tensor();
}

}  // namespace moecore::nn
