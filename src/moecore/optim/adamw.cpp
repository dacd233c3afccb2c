// AdamW (see adamw.h).
#include "moecore/optim/adamw.h"

#include "moecore/kernels/backend.h"
#include "moecore/nn/fp8_param.h"
#include "moecore/optim/grad_buffer.h"

namespace moecore::optim {

AdamW::AdamW(std::vector<nn::Parameter*> params, ElementRule rule) : params_(std::move(params)), rule_(rule) {
  for (auto* p : params_) {
    const DType dt = p->math_dtype();
    m_.push_back(Tensor::zeros(p->value.shape(), rule_.exp_avg_dtype(dt), p->value.device()));
    v_.push_back(Tensor::zeros(p->value.shape(), rule_.exp_avg_sq_dtype(dt), p->value.device()));
    master_.emplace_back();
    if (p->fp8) {  // --fp8-param-gather: the f32 value becomes the master; the model keeps its FP8 cast
      master_.back() = p->value;
      p->value = Tensor::empty(p->value.shape(), DType::F32, p->value.device());
      nn::fp8_cast_whole(*p, master_.back());
      continue;
    }
    if (!is_half(storage_dtype(*p))) continue;
    // The f32 value becomes the master; the model keeps it rounded.
    master_.back() = p->value.dtype() == DType::F32 ? p->value : p->value.to(DType::F32);
    p->value = master_.back().to(storage_dtype(*p));
    p->low_cache = Tensor();
  }
}

void AdamW::gather_master(std::vector<Tensor>& w) const {
  w.clear();
  for (size_t i = 0; i < params_.size(); i++)
    w.push_back((master_[i].defined() ? master_[i] : params_[i]->value).to(Device::cpu()).clone());
}

void AdamW::load_master(const std::vector<Tensor>& w) {
  MOE_ASSERT(w.size() == params_.size());
  for (size_t i = 0; i < params_.size(); i++) {
    if (master_[i].defined()) master_[i].copy_from(w[i]);
    if (params_[i]->fp8)
      nn::fp8_cast_whole(*params_[i], master_[i]);  // as after a step
    else
      params_[i]->value.copy_from(w[i]);  // rounded where stored in bf16
  }
}

void AdamW::step(const kernels::AdamWParams& hp, int64_t step) {
  std::vector<kernels::AdamWTensor> all;
  all.reserve(params_.size());
  // Where a bf16 copy of the weight exists (bf16 GEMMs read it), the update writes it too (CPU AdamW): the next
  // step's Bf16WeightScope starts from it instead of rounding every weight again.
  for (size_t i = 0; i < params_.size(); i++) {
    nn::Parameter& p = *params_[i];
    const double wd = p.no_weight_decay ? 0.0 : hp.weight_decay;
    if (p.fp8) {  // the master updated, the model's value cast from it below
      all.push_back({master_[i], p.grad, m_[i], v_[i], wd});
      continue;
    }
    if (master_[i].defined()) {  // stored in bf16: the master updated, the model's value its rounding
      all.push_back({master_[i], p.grad, m_[i], v_[i], wd, p.value});
      continue;
    }
    all.push_back({p.value, p.grad, m_[i], v_[i], wd});
    p.low_cache_from_update = !rule_.sgd && p.value.dtype() == DType::F32 && p.low_cache.defined() &&
                              p.low_cache.numel() == p.value.numel() && p.low_cache.dtype() == DType::BF16 &&
                              kernels::backend_offers(p.low_cache.device()).update_writes_bf16_copy;
    if (p.low_cache_from_update) all.back().param_bf16 = p.low_cache;
  }
  element_step_multi(rule_, all, hp, step);
  // --fp8-param-gather without sharding: each rank holds the whole master, so it casts the whole tensor.
  for (size_t i = 0; i < params_.size(); i++)
    if (params_[i]->fp8) nn::fp8_cast_whole(*params_[i], master_[i]);
}

void AdamW::load_moments(const std::vector<Tensor>& m, const std::vector<Tensor>& v) {
  MOE_ASSERT(m.size() == m_.size() && v.size() == v_.size());
  for (size_t i = 0; i < m_.size(); i++) {
    m_[i].copy_from(m[i]);  // converted to the storage dtype
    v_[i].copy_from(v[i]);
  }
}

}  // namespace moecore::optim
