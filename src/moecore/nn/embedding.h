// Token embedding table [V, H], looked up by id.
#pragma once

#include <string>

#include "moecore/nn/parameter.h"

namespace moecore::nn {

class Embedding {
 public:
  struct Stash {
    Tensor ids_T;
  };
  Embedding(ParamRegistry& reg, const std::string& name, int64_t vocab, int64_t hidden, double init_std);
  // ids_T [T] (i32/i64) -> [T, H]
  Tensor forward(const Tensor& ids_T, Stash& st);
  // dy [T, H] -> accumulates into the table's gradient.
  void backward(const Tensor& dy_TH, Stash& st);
  Parameter& weight() { return *weight_; }

 private:
  Parameter* weight_;
};

}  // namespace moecore::nn
