// The interface a transformer layer's FFN slot takes: the dense MLP here, the MoE layer in moe/.
// Each implementation defines its own stash type deriving from FeedForward::Stash.
#pragma once

#include <memory>

#include "moecore/core/tensor.h"

namespace moecore::nn {

class FeedForward {
 public:
  struct Stash {
    virtual ~Stash() = default;
  };
  virtual ~FeedForward() = default;
  virtual std::unique_ptr<Stash> make_stash() const = 0;
  // x_SBH [S, B, H] -> [S, B, H]
  virtual Tensor forward(const Tensor& x_SBH, Stash& st) = 0;
  virtual Tensor backward(const Tensor& dy_SBH, Stash& st) = 0;
};

}  // namespace moecore::nn
