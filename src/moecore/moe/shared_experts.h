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
    Tensor x_TH, out_TH, gate_T;  // gate only: x and the MLP's output (bf16 under --bf16), the gate values
    Tensor x_in;                  // recompute: the input, all the stash keeps after forward
  };
  // recompute: --recompute-modules shared_experts (the stash keeps only the input; backward re-runs forward).
  SharedExperts(nn::ParamRegistry& reg, const std::string& name, const nn::MLPConfig& cfg, bool gate,
                bool recompute = false);
  Stash make_stash() const;
  // replay: this forward is a recompute's replay (of the MoE layer), kept whole for the backward that follows.
  Tensor forward(const Tensor& x_SBH, Stash& st, bool replay = false);
  Tensor backward(const Tensor& dy_SBH, Stash& st);
  // --recompute-modules layernorm: forget / put back every reference to the input x (see FeedForward).
  void drop_input(const Tensor& x, Stash& st) const;
  void restore_input(const Tensor& x, Stash& st) const;

 private:
  Tensor forward_impl(const Tensor& x_SBH, Stash& st);
  Tensor kept(const Tensor& t) const;  // what the stash keeps of an f32 tensor for backward: bf16 under --bf16
  bool recompute_ = false;
  LowPrecision low_{};  // the gate's kept x and MLP output in bf16 or f16
  nn::MLP mlp_;
  nn::Parameter* gate_ = nullptr;  // [1, H]
};

}  // namespace moecore::moe
