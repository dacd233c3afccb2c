// AdamW over a list of parameters whose gradients are already final on this rank: fp32 moments per parameter, no
// weight decay where the parameter says so (norms, biases, router bias). The distributed optimizer
// (distributed_optimizer.h) is the sharded form; this one keeps every moment whole. Not for gradient reduction
// (grad_sync.h) or clipping (chained_optimizer.h).
#pragma once

#include <vector>

#include "moecore/kernels/adamw.h"
#include "moecore/nn/parameter.h"
#include "moecore/optim/sgd.h"

namespace moecore::optim {

class AdamW {
 public:
  // `rule`: AdamW, or SGD with momentum (m holds the momentum buffer, v stays zero).
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

 private:
  std::vector<nn::Parameter*> params_;
  ElementRule rule_;
  std::vector<Tensor> m_, v_;
};

}  // namespace moecore::optim
