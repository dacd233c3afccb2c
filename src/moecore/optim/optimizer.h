// The interface of an optimizer for one class of parameters (dense, or expert) and the group its gradients are
// reduced over: the ChainedOptimizer drives one per class through it, whether the state is replicated (AdamW with
// all-reduced buckets) or sharded (ShardedAdamW, Megatron's distributed optimizer).
#pragma once

#include <vector>

#include "moecore/kernels/adamw.h"
#include "moecore/nn/parameter.h"

namespace moecore::optim {

class ParamClassOptimizer {
 public:
  virtual ~ParamClassOptimizer() = default;
  // The parameters, in the order of the moment lists below.
  virtual const std::vector<nn::Parameter*>& params() const = 0;
  // Bucket b's gradients are final (in the last micro-batch's backward): start reducing them (non-blocking).
  virtual void start_bucket(size_t b) = 0;
  // Starts what was not started, waits for every reduction, scales the sums by `scale` (1/DP). Returns this rank's
  // weighted share of the squared gradient norm (shares summed over all ranks count every element once).
  virtual double reduce_gradients(double scale) = 0;
  // After reduce_gradients: this rank's weighted share of the zero entries of the reduced gradients (shares summed
  // over all ranks count every element once; Megatron's --log-num-zeros-in-grad).
  virtual double zero_share() const = 0;
  // AdamW with per-parameter weight decay; `step` ≥ 1.
  virtual void step(const kernels::AdamWParams& hp, int64_t step) = 0;
  // The Adam moments whole per parameter (collective where sharded), and back.
  virtual void gather_moments(std::vector<Tensor>& m, std::vector<Tensor>& v) const = 0;
  virtual void load_moments(const std::vector<Tensor>& m, const std::vector<Tensor>& v) = 0;
  // Re-reads fp32 master state from the parameters after they were loaded (nothing where the parameters are it).
  virtual void refresh_master() = 0;
};

}  // namespace moecore::optim
