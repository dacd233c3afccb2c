// The routed experts' FP8 GEMM sites (nn/fp8_gemm.h): one per expert and projection, each with its own scales, as
// TransformerEngine's grouped linear keeps one set of FP8 metadata per expert GEMM. None when the layer stays in
// higher precision. Not the experts' control flow (grouped_experts.cpp calls these per expert).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "moecore/nn/fp8_gemm.h"

namespace moecore::moe {

class ExpertFp8 {
 public:
  static constexpr int kFc1 = 0, kFc2 = 1;
  // Sites for experts [0, num_experts) of the parameters named `fc1_name` and `fc2_name`, if the model is built
  // under an FP8 scope that covers them; per-tensor amaxes are reduced over the expert-tensor-parallel group `etp`.
  void build(const std::string& fc1_name, const std::string& fc2_name, int64_t num_experts, int64_t first_expert,
             nn::TPContext etp);
  bool on() const { return !sites_[0].empty(); }
  // Projection proj's sites, one per local expert (empty where the layer stays in higher precision).
  const std::vector<std::shared_ptr<nn::Fp8Gemm>>& sites(int proj) const { return sites_[proj]; }
  // y_e = Q(x_e)·Q(W_e)ᵀ; x's scale kept in x_scales[proj·E + e] (the stash's) for the backward.
  void forward(int proj, int64_t e, const Tensor& x, const Tensor& w_e, Tensor& y, std::vector<float>& x_scales);
  // dx_e = Q(dy_e)·Q(W_e) (written); dW_e = beta·dW_e + Q(dy_e)ᵀ·Q(x_e).
  void backward(int proj, int64_t e, const Tensor& dy, const Tensor& x, const std::vector<float>& x_scales, Tensor& dx,
                Tensor& dw_e, float beta);

 private:
  std::vector<std::shared_ptr<nn::Fp8Gemm>> sites_[2];
  std::vector<Tensor> wq_[2];  // each expert's weight as its last forward cast it
};

}  // namespace moecore::moe
