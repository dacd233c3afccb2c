// AdamW (see adamw.h).
#include "moecore/optim/adamw.h"

namespace moecore::optim {

AdamW::AdamW(std::vector<nn::Parameter*> params, ElementRule rule) : params_(std::move(params)), rule_(rule) {
  for (auto* p : params_) {
    m_.push_back(Tensor::zeros(p->value.shape(), p->value.dtype()));
    v_.push_back(Tensor::zeros(p->value.shape(), p->value.dtype()));
  }
}

void AdamW::step(const kernels::AdamWParams& hp, int64_t step) {
  for (size_t i = 0; i < params_.size(); i++) {
    nn::Parameter& p = *params_[i];
    kernels::AdamWParams h = hp;
    if (p.no_weight_decay) h.weight_decay = 0;
    element_step(rule_, p.value, p.grad, m_[i], v_[i], h, step);
  }
}

}  // namespace moecore::optim
