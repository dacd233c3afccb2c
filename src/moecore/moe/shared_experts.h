// Shared experts: a dense MLP every token goes through, added to the routed output; optionally gated by
// sigmoid(x·w_g) per token (--moe-shared-expert-gate, Qwen2-MoE style).
#pragma once

#include <memory>
#include <string>

#include "moecore/nn/mlp.h"

namespace moecore::moe {

class SharedExperts {
 public:
  struct Stash {
    std::unique_ptr<nn::FeedForward::Stash> mlp;
    Tensor x_TH, out_TH, gate_T;  // gate only
  };
  SharedExperts(nn::ParamRegistry& reg, const std::string& name, const nn::MLPConfig& cfg, bool gate);
  Stash make_stash() const;
  Tensor forward(const Tensor& x_SBH, Stash& st);
  Tensor backward(const Tensor& dy_SBH, Stash& st);

 private:
  nn::MLP mlp_;
  nn::Parameter* gate_ = nullptr;  // [1, H]
};

}  // namespace moecore::moe
