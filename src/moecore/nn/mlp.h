// Dense MLP: fc1 → activation → fc2. For SwiGLU, fc1 is [2F, H] with gate rows first, then linear rows (Megatron's
// gated_linear_unit layout); fc2 is [H, F]. Under tensor parallelism fc1 is column- and fc2 row-parallel: the
// block takes and returns sequence shards [S/TP, B, H] (see tensor_parallel.h).
#pragma once

#include <string>

#include "moecore/kernels/activation.h"
#include "moecore/kernels/backend.h"
#include "moecore/nn/feed_forward.h"
#include "moecore/nn/linear.h"
#include "moecore/nn/tensor_parallel.h"

namespace moecore::nn {

struct MLPConfig {
  int64_t hidden = 0;
  int64_t ffn_hidden = 0;
  kernels::Activation activation = kernels::Activation::SwiGLU;
  bool bias = false;
  double init_std = 0.02;
  double output_init_std = 0.02;
  LowPrecision low{};  // --bf16 or --fp16
  TPContext tp;
  bool recompute = false;  // --recompute-modules mlp: the stash keeps only the input; backward re-runs forward
};

class MLP : public FeedForward {
 public:
  struct Stash : FeedForward::Stash {
    Linear::Stash fc1, fc2;
    Tensor h;     // fc1 output, the activation's input (bf16 under --bf16)
    Tensor x_in;  // recompute: the block's input [S/TP, B, H], all the stash keeps after forward
  };
  MLP(ParamRegistry& reg, const std::string& name, const MLPConfig& cfg);
  std::unique_ptr<FeedForward::Stash> make_stash() const override { return std::make_unique<Stash>(); }
  Tensor forward(const Tensor& x_SBH, FeedForward::Stash& st) override;
  LowPrecision low_input() const override { return cfg_.low; }
  Tensor backward(const Tensor& dy_SBH, FeedForward::Stash& st) override;
  void drop_input(const Tensor& x, FeedForward::Stash& st) const override;
  void restore_input(const Tensor& x, FeedForward::Stash& st) const override;

 private:
  Tensor forward_impl(const Tensor& x_SBH, Stash& st);
  // Whether fc1 writes h in the 16-bit dtype on device d (bf16 or f16 GEMMs, no bias, where the backend's GEMMs
  // write 16-bit outputs).
  bool h_low(Device d) const { return cfg_.low && !cfg_.bias && kernels::backend_offers(d).gemm_bf16_output; }
  MLPConfig cfg_;
  Linear fc1_, fc2_;
};

}  // namespace moecore::nn
