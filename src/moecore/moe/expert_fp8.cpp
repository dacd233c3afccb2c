// The routed experts' FP8 sites (see expert_fp8.h).
#include "moecore/moe/expert_fp8.h"

#include <fmt/format.h>

namespace moecore::moe {

void ExpertFp8::build(const std::string& fc1_name, const std::string& fc2_name, int64_t num_experts,
                      int64_t first_expert, nn::TPContext etp) {
  const std::string names[2] = {fc1_name, fc2_name};
  for (int p = 0; p < 2; p++) {
    sites_[p].clear();
    for (int64_t e = 0; e < num_experts; e++) {
      auto site = nn::fp8_gemm_for(fmt::format("{} (expert {})", names[p], first_expert + e), etp);
      if (!site) {
        sites_[p].clear();
        break;
      }
      sites_[p].push_back(std::move(site));
    }
    wq_[p].assign(sites_[p].size(), Tensor());
  }
}

void ExpertFp8::forward(int proj, int64_t e, const Tensor& x, const Tensor& w_e, Tensor& y,
                        std::vector<float>& x_scales) {
  const size_t E = sites_[proj].size(), i = static_cast<size_t>(e);
  if (x_scales.size() != 2 * E) x_scales.assign(2 * E, 0.0f);
  x_scales[static_cast<size_t>(proj) * E + i] = nn::fp8_forward(*sites_[proj][i], x, w_e, y, wq_[proj][i]);
}

void ExpertFp8::backward(int proj, int64_t e, const Tensor& dy, const Tensor& x, const std::vector<float>& x_scales,
                         Tensor& dx, Tensor& dw_e, float beta) {
  const size_t E = sites_[proj].size(), i = static_cast<size_t>(e);
  MOE_ASSERT(x_scales.size() == 2 * E);
  nn::fp8_backward(*sites_[proj][i], dy, x, x_scales[static_cast<size_t>(proj) * E + i], wq_[proj][i], dx, 0.0f, dw_e,
                   beta);
}

}  // namespace moecore::moe
