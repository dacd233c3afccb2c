// The routed experts of one MoE layer: weights stacked per expert (fc1 [E, F1, H] with F1 = 2F for SwiGLU, gate
// rows first; fc2 [E, H, F]) and one grouped GEMM per projection over the rows of every local expert, whose row
// counts change every step (experts with no rows are skipped). The router probability multiplies the activation
// inside the expert: y = fc2(act(fc1·x) ⊙ p), as Megatron does. With biases (Megatron's default --add-bias-linear;
// fc1's [E, F1] in fc1's row order, fc2's [E, H]) it is Megatron's TEGroupedMLP: y = fc2(act(fc1·x + b1) ⊙ p) + b2·p,
// fc2's bias scaled by the probability (_apply_bias). One path for both devices: grouped GEMMs
// (kernels/grouped_gemm.h), segment biases and the activation, on rows padded to the device's grouped GEMM row
// alignment (the CPU's 32; none on a GPU).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "moecore/kernels/activation.h"
#include "moecore/moe/expert_fp8.h"
#include "moecore/nn/parameter.h"

namespace moecore::moe {

struct ExpertsConfig {
  int64_t hidden = 0;        // H
  int64_t ffn_hidden = 0;    // F held here: --moe-ffn-hidden-size / ETP
  int64_t num_experts = 0;   // local experts
  int64_t first_expert = 0;  // global index of the first local expert (expert parallelism)
  kernels::Activation activation = kernels::Activation::SwiGLU;
  double init_std = 0.02;
  double output_init_std = 0.02;
  LowPrecision low{};              // --bf16 or --fp16: the experts' GEMM operands, weights and rows
  int64_t num_global_experts = 0;  // E over all EP ranks (0: num_experts)
  // Expert tensor parallelism: this rank holds FFN columns [etp_rank·F, (etp_rank + 1)·F) of every local expert
  // (fc1 column-parallel, fc2 row-parallel, outputs partial sums over ETP).
  int64_t etp_size = 1, etp_rank = 0;
  const comm::ProcessGroup* etp_group = nullptr;  // FP8: per-tensor amaxes are reduced over it
  // --recompute-modules moe_act: a_RF is dropped after forward and recomputed from h_RF1 and probs_R in backward.
  bool recompute_act = false;
  // fc1 and fc2 biases per expert (Megatron's --add-bias-linear; ETP 1 only, as in Megatron), initialised to zero.
  bool bias = false;
};

class GroupedExperts {
 public:
  // Rows inside the experts are padded: each expert's rows start at a multiple of row_align (see grouped_experts.cpp).
  struct Stash {
    Tensor x_RH;     // input rows as fed to fc1 (bf16 when bf16 is on), padded
    Tensor h_RF1;    // fc1 output (+ b1), padded (bf16 when bf16 is on: written so, or rounded after the bias)
    Tensor a_RF;     // activation ⊙ prob, as fed to fc2, padded (undefined under moe_act recompute)
    Tensor probs_R;  // padded (zero in the gaps)
    std::vector<int64_t> tokens_per_expert;
    std::vector<int64_t> row_begin;   // each expert's first row inside the experts (padded)
    std::vector<int64_t> block_rows;  // each expert's rows and the zero gap after them
    int64_t row_align = 1;            // of the padded layout (row_align(device))
    bool padded_io = false;           // the rows came (and go back) in the padded layout
    std::vector<float> fp8_x_scales;  // FP8: each expert GEMM's input scale (expert_fp8.h)
    // Delayed weight gradients (backward with defer_wgrad): the operands of the fc2 and fc1 weight-gradient GEMMs
    // (dy·aᵀ and dh·xᵀ per expert) and the betas taken for them, until backward_wgrad runs them.
    struct DeferredWgrad {
      Tensor dy, a, dh, x;
      float beta2 = 0, beta1 = 0;
      bool pending = false;
    } wgrad;
  };

  GroupedExperts(nn::ParamRegistry& reg, const std::string& name, const ExpertsConfig& cfg);
  // x_RH [R, H], probs_R [R], rows grouped by expert with the given counts -> y_RH [R, H]. With bf16 on, x_RH
  // (and dy_RH in backward) may arrive already in bf16. The rows may also arrive in the padded layout
  // (row_align(device): R is then the padded row count, with zero gap rows of probability 0, as the dispatcher writes
  // them under DispatchPlan::row_align); the outputs (y, and in backward dx and dprobs) are then padded too. With bf16
  // on, y and dx are bf16 (f32 under expert tensor parallelism).
  Tensor forward(const Tensor& x_RH, const Tensor& probs_R, const std::vector<int64_t>& tokens_per_expert, Stash& st);
  // dy_RH -> dx_RH (written), dprobs_R (written); expert weight grads accumulated. With defer_wgrad (Megatron's
  // --delay-wgrad-compute) only the data gradients: the weight-gradient GEMMs wait in st.wgrad for backward_wgrad,
  // so the dispatcher's backward all-to-all can run beside them; the same GEMMs on the same operands either way.
  Tensor backward(const Tensor& dy_RH, Stash& st, Tensor& dprobs_R, bool defer_wgrad = false);
  // The deferred weight-gradient GEMMs of the last backward(defer_wgrad); nothing if none is pending. `between`
  // runs between the fc2 and fc1 GEMMs (the layer lets the host transport progress the exchange in flight there).
  void backward_wgrad(Stash& st, const std::function<void()>& between = {});

  nn::Parameter& fc1() { return *fc1_; }
  nn::Parameter& fc2() { return *fc2_; }
  nn::Parameter* fc1_bias() { return b1_; }  // null without biases
  nn::Parameter* fc2_bias() { return b2_; }
  const ExpertsConfig& config() const { return cfg_; }
  int64_t fc1_rows() const { return (kernels::is_gated(cfg_.activation) ? 2 : 1) * cfg_.ffn_hidden; }
  // The padded layout on `d`: each expert's rows start at a multiple of this (kernels::grouped_gemm_row_align).
  static int64_t row_align(Device d);

 private:
  // Creates the fixed-shape GEMM primitives every row count will use, so no step ever creates one.
  void prepare_gemms() const;
  DType rows_out_dtype() const;  // of y and dx
  DType h_dtype() const;         // of the fc1 output (and da, the activation's output gradient)
  // The biases on the experts' rows st.row_begin, st.tokens_per_expert, for both devices; no-ops without biases.
  // Forward: h_RF1 += b1_e; y_RH += b2_e·p. Backward (accumulating): db1_e += Σ dh; db2_e += Σ p·dy and
  // dprobs_R += dy·b2_e.
  void fc1_bias_forward(const Stash& st, Tensor& h_RF1) const;
  void fc2_bias_forward(const Stash& st, Tensor& y_RH) const;
  void fc1_bias_backward(const Stash& st, const Tensor& dh_RF1);
  void fc2_bias_backward(const Stash& st, const Tensor& dy_RH, Tensor& dprobs_R);

  ExpertsConfig cfg_;
  nn::Parameter* fc1_;
  nn::Parameter* fc2_;
  nn::Parameter* b1_ = nullptr;  // [E, F1]
  nn::Parameter* b2_ = nullptr;  // [E, H]
  Tensor w1_low_, w2_low_;
  ExpertFp8 fp8_;  // FP8 GEMM sites, where the model runs them
};

// Reference: the same experts computed row by row with plain loops in f64, one expert at a time, with the biases
// b1_EF1 and b2_EH where given. Kept for tests.
Tensor sequential_experts_forward(const Tensor& w1_EFH, const Tensor& w2_EHF, kernels::Activation act,
                                  const Tensor& x_RH, const Tensor& probs_R,
                                  const std::vector<int64_t>& tokens_per_expert, const Tensor* b1_EF1 = nullptr,
                                  const Tensor* b2_EH = nullptr);

}  // namespace moecore::moe
