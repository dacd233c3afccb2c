// Linear layer y = x·Wᵀ (+ b), W stored [out, in] as in Megatron and HuggingFace. With bf16 or f16 on (--bf16,
// --fp16), GEMM operands are rounded to it (f32 accumulation, f32 output) and the stash keeps the rounded input; master
// weights and gradients stay f32. A Linear can also wrap a parameter owned elsewhere (the tied output layer uses the
// embedding).
#pragma once

#include <memory>
#include <string>

#include "moecore/kernels/backend.h"
#include "moecore/nn/parameter.h"
#include "moecore/nn/tensor_parallel.h"

namespace moecore::nn {

class Fp8Gemm;  // fp8_recipe.h

// Tensor-parallel split of the weight (sizes in LinearConfig stay global): Column keeps rows
// [r·out/TP, (r+1)·out/TP) — for a gated FFN's fc1 the same share of the gate and of the linear half — and Row
// keeps input columns [r·in/TP, (r+1)·in/TP), its outputs being partial sums over the TP ranks.
enum class TPSplit { None, Column, Row };

struct LinearConfig {
  int64_t in = 0;
  int64_t out = 0;
  bool bias = false;
  InitRule init = InitRule::normal(0.02);
  LowPrecision low{};             // GEMM operands and the stored weight in bf16 or f16
  TPSplit split = TPSplit::None;  // applies when tp has more than one rank
  TPContext tp = {};
  bool gated = false;  // Column split of [gate; linear] halves
};

class Linear {
 public:
  struct Stash {
    Tensor x;               // input as fed to the GEMM ([rows, in]; bf16 when bf16 is on)
    float fp8_x_scale = 0;  // FP8 GEMMs: the scale x was cast with (fp8_gemm.h)
  };

  Linear(ParamRegistry& reg, const std::string& name, const LinearConfig& cfg);
  // Wraps an existing weight [out, in] (no bias), e.g. the tied output layer.
  Linear(Parameter& weight, LowPrecision low);

  // x [..., in] -> y [rows, out]
  // With bf16 on, x and dy may already be bf16 (written so by the op that produced them): then they are used as
  // they are, with no cast pass, and the stash shares x. y is f32, or bf16 when `out` asks (bf16 on, no bias, CPU):
  // rounded as the GEMM writes it, for a consumer that keeps it in bf16.
  Tensor forward(const Tensor& x, Stash& st, DType out = DType::F32);
  // The 16-bit dtype (bf16 or f16) where forward can write it for inputs on `dev` (16-bit on, no bias, a backend
  // whose GEMMs write 16-bit outputs), else f32.
  DType low_output_where_possible(const Device& dev) const {
    return low_ && bias_ == nullptr && kernels::backend_offers(dev).gemm_bf16_output && !fp8_ ? *low_ : DType::F32;
  }
  // What forward keeps of its input x, without the GEMM: recompute puts back an input it dropped.
  void stash_input(const Tensor& x, Stash& st) const;
  // dy [rows, out] -> dx [rows, in] (written); dW, db accumulated. dx is f32, or bf16 when `dx_out` asks (bf16 on,
  // CPU): rounded as the GEMM writes it, for a consumer that reads it in bf16.
  Tensor backward(const Tensor& dy, Stash& st, DType dx_out = DType::F32);
  // The same with dx += dy·W summed by the GEMM into the caller's dx ([rows, in], the weights' dtype): a sum with
  // another input gradient (attention's q, k and v projections) in no pass of its own.
  void backward_add(const Tensor& dy, Stash& st, Tensor& dx);

  Parameter& weight() { return *weight_; }
  int64_t in() const { return in_; }    // local (this rank's share under a Row split)
  int64_t out() const { return out_; }  // local (this rank's share under a Column split)

 private:
  Parameter* weight_ = nullptr;
  Parameter* bias_ = nullptr;
  int64_t in_ = 0, out_ = 0;
  LowPrecision low_{};
  Tensor w_low_;  // bf16 (f16) copy of the weight, refreshed every forward
  // FP8 GEMMs (the model was built under an Fp8ModelScope and this is one of its sites): the site and the weight as
  // cast by forward, which the data gradient reuses.
  std::shared_ptr<Fp8Gemm> fp8_;
  Tensor w_fp8_;
  // dx = beta·dx + dy·W; dW, db accumulated.
  void backward_into(const Tensor& dy, Stash& st, Tensor& dx, float beta);
};

}  // namespace moecore::nn
