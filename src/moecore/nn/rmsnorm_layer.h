// RMSNorm module over the last dimension (hidden size, or head dim for Qwen3-style qk-norm). Weight init ones,
// excluded from weight decay.
#pragma once

#include <string>

#include "moecore/nn/parameter.h"

namespace moecore::nn {

class RMSNorm {
 public:
  struct Stash {
    Tensor x, rstd;
  };
  RMSNorm(ParamRegistry& reg, const std::string& name, int64_t dim, double eps);
  // x [..., dim] -> y (same shape)
  Tensor forward(const Tensor& x, Stash& st);
  Tensor backward(const Tensor& dy, Stash& st);

 private:
  Parameter* weight_;
  double eps_;
};

}  // namespace moecore::nn
