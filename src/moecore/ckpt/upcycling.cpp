// Upcycling (see upcycling.h).
#include "moecore/ckpt/upcycling.h"

#include <cmath>
#include <cstring>

#include "moecore/ckpt/checkpoint.h"
#include "moecore/core/error.h"

namespace moecore::ckpt {

double upcycling_scale(int64_t experts, int64_t g, int64_t topk, bool pre_softmax, bool cubic) {
  const double r = static_cast<double>(experts / g);
  const double act_scale =
      pre_softmax ? r * static_cast<double>(g * g) / static_cast<double>(topk) : static_cast<double>(g);
  return std::pow(act_scale, cubic ? 1.0 / 3.0 : 0.5);
}

std::pair<Tensor, Tensor> upcycle_experts(const Tensor& fc1_hFH, const Tensor& fc2_HF, int64_t E, int64_t g,
                                          double scale) {
  MOE_ASSERT(fc1_hFH.ndim() == 3 && fc2_HF.ndim() == 2 && fc1_hFH.dtype() == DType::F32);
  const int64_t halves = fc1_hFH.dim(0), F = fc1_hFH.dim(1), H = fc1_hFH.dim(2), Fm = F / g;
  MOE_ASSERT(fc2_HF.dim(0) == H && fc2_HF.dim(1) == F && F % g == 0 && E % g == 0);
  Tensor e1 = Tensor::empty({E, halves, Fm, H}, DType::F32), e2 = Tensor::empty({E, H, Fm}, DType::F32);
  const float* d1 = fc1_hFH.data<float>();
  const float* d2 = fc2_HF.data<float>();
  for (int64_t e = 0; e < E; e++) {
    const int64_t c = e % g;
    for (int64_t h = 0; h < halves; h++)
      for (int64_t f = 0; f < Fm; f++)
        for (int64_t x = 0; x < H; x++)
          e1.data<float>()[((e * halves + h) * Fm + f) * H + x] =
              static_cast<float>(scale * d1[(h * F + c * Fm + f) * H + x]);
    for (int64_t x = 0; x < H; x++)
      for (int64_t f = 0; f < Fm; f++)
        e2.data<float>()[(e * H + x) * Fm + f] = static_cast<float>(scale * d2[x * F + c * Fm + f]);
  }
  return {e1, e2};
}

void tie_router_rows(Tensor& router_EH, int64_t g) {
  MOE_ASSERT(router_EH.ndim() == 2 && router_EH.dtype() == DType::F32);
  const int64_t E = router_EH.dim(0), H = router_EH.dim(1);
  const Tensor init = router_EH.clone();
  for (int64_t e = 0; e < E; e++)
    std::memcpy(router_EH.data<float>() + e * H, init.data<float>() + (e / g) * H, static_cast<size_t>(H) * 4);
}

void upcycle_layer(const std::string& dir, const std::string& prefix, const DenseFFN& dense, int64_t g, double scale,
                   nn::Parameter& fc1, nn::Parameter& fc2, Tensor& router_EH) {
  const int64_t F = dense.ffn_hidden, H = dense.hidden, halves = dense.gated ? 2 : 1;
  const int64_t E = box_of(fc2).global[0];  // fc2 is [E, H, F/g] globally
  // fc1 as [2, F, H] or [F, H]: a whole box of either has the same bytes as [halves, F, H].
  Tensor fc1_hFH = Tensor::empty({halves, F, H}, DType::F32), fc2_HF = Tensor::empty({H, F}, DType::F32);
  Tensor fc1_stored = dense.gated ? fc1_hFH : fc1_hFH.reshape({F, H});
  load_tensors(dir, {{prefix + "linear_fc1.weight", whole_box(fc1_stored.shape()), &fc1_stored},
                     {prefix + "linear_fc2.weight", whole_box(fc2_HF.shape()), &fc2_HF}});
  auto [e1, e2] = upcycle_experts(fc1_hFH, fc2_HF, E, g, scale);
  Tensor e1_stored = dense.gated ? e1 : e1.reshape({E, F / g, H});
  copy_intersection(e1_stored, whole_box(e1_stored.shape()), fc1.value, box_of(fc1));
  copy_intersection(e2, whole_box(e2.shape()), fc2.value, box_of(fc2));
  tie_router_rows(router_EH, g);  // replicated, initialized by global index
}

}  // namespace moecore::ckpt
