// AdamW (see adamw.h).
#include "moecore/optim/adamw.h"

namespace moecore::optim {

AdamW::AdamW(std::vector<nn::Parameter*> params, ElementRule rule) : params_(std::move(params)), rule_(rule) {
  for (auto* p : params_) {
    m_.push_back(Tensor::zeros(p->value.shape(), rule_.exp_avg_dtype(p->value.dtype()), p->value.device()));
    v_.push_back(Tensor::zeros(p->value.shape(), rule_.exp_avg_sq_dtype(p->value.dtype()), p->value.device()));
  }
}

void AdamW::step(const kernels::AdamWParams& hp, int64_t step) {
  std::vector<kernels::AdamWTensor> all;
  all.reserve(params_.size());
  // Where a bf16 copy of the weight exists (bf16 GEMMs read it), the update writes it too (CPU AdamW): the next
  // step's Bf16WeightScope starts from it instead of rounding every weight again.
  for (size_t i = 0; i < params_.size(); i++) {
    nn::Parameter& p = *params_[i];
    all.push_back({p.value, p.grad, m_[i], v_[i], p.no_weight_decay ? 0.0 : hp.weight_decay});
    p.bf16_cache_from_update = !rule_.sgd && p.value.dtype() == DType::F32 && p.bf16_cache.defined() &&
                               p.bf16_cache.numel() == p.value.numel() && !p.bf16_cache.device().is_cuda();
    if (p.bf16_cache_from_update) all.back().param_bf16 = p.bf16_cache;
  }
  element_step_multi(rule_, all, hp, step);
}

void AdamW::load_moments(const std::vector<Tensor>& m, const std::vector<Tensor>& v) {
  MOE_ASSERT(m.size() == m_.size() && v.size() == v_.size());
  for (size_t i = 0; i < m_.size(); i++) {
    m_[i].copy_from(m[i]);  // converted to the storage dtype
    v_[i].copy_from(v[i]);
  }
}

}  // namespace moecore::optim
