// AdamW over a list of parameters whose gradients are already final on this rank: fp32 moments per parameter, no
// weight decay where the parameter says so (norms, biases, router bias), and the fp32 master weights of the
// parameters the model stores in bf16 (nn::Parameter::bf16_storage). The distributed optimizer
// (distributed_optimizer.h) is the sharded form; this one keeps every moment whole. Not for gradient reduction
// (grad_sync.h) or clipping (chained_optimizer.h).
#pragma once

#include <vector>

#include "moecore/kernels/adamw_update.h"
#include "moecore/nn/parameter.h"
#include "moecore/optim/sgd.h"

namespace moecore::optim {

class AdamW {
 public:
  // `rule`: AdamW, or SGD with momentum (m holds the momentum buffer, v stays zero). A parameter marked
  // bf16_storage is held in bf16 in the model from here on: its f32 master (the value it had) lives here.
  explicit AdamW(std::vector<nn::Parameter*> params, ElementRule rule = {});
  // One update of every parameter from its gradient; `step` ≥ 1 counts updates (bias correction).
  void step(const kernels::AdamWParams& hp, int64_t step);
  const std::vector<nn::Parameter*>& params() const { return params_; }
  // The moments, one whole tensor per parameter in params() order, in their storage dtype (checkpoints read them;
  // load_moments copies into them, converting).
  std::vector<Tensor>& exp_avg() { return m_; }
  std::vector<Tensor>& exp_avg_sq() { return v_; }
  const std::vector<Tensor>& exp_avg() const { return m_; }
  const std::vector<Tensor>& exp_avg_sq() const { return v_; }
  void load_moments(const std::vector<Tensor>& m, const std::vector<Tensor>& v);
  // The f32 weights whole per parameter on the host (the master, or the f32 value), and back (optimizer.h).
  void gather_master(std::vector<Tensor>& w) const;
  void load_master(const std::vector<Tensor>& w);
  // The f32 weights of parameter i: its master, or its f32 value.
  const Tensor& master(size_t i) const { return master_[i].defined() ? master_[i] : params_[i]->value; }

 private:
  std::vector<nn::Parameter*> params_;
  ElementRule rule_;
  std::vector<Tensor> m_, v_;
  std::vector<Tensor> master_;  // per parameter: its f32 master where the model holds it in bf16, else undefined
};

}  // namespace moecore::optim
