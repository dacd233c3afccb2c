// Helpers of the router tests: a router whose logits are its input rows, tensors from rows, the sigmoid.
#pragma once

#include <cmath>
#include <vector>

#include "moecore/moe/router.h"

namespace moecore::testing {

// A router whose weight is the identity (H = E), so the logits equal the input rows.
struct IdentityRouter {
  nn::ParamRegistry reg{DType::F64};
  moe::Router router;
  explicit IdentityRouter(moe::RouterConfig c)
      : router(reg, "router", (c.hidden = c.num_experts, c.router_dtype = DType::F64, c)) {
    Tensor& w = router.weight().value;
    w.zero_();
    for (int64_t e = 0; e < c.num_experts; e++) w.set_item(e * c.num_experts + e, 1.0);
  }
};

// [rows, cols] f64 from nested rows.
inline Tensor rows(const std::vector<std::vector<double>>& v) {
  Tensor t = Tensor::empty({static_cast<int64_t>(v.size()), static_cast<int64_t>(v[0].size())}, DType::F64);
  for (size_t i = 0; i < v.size(); i++)
    for (size_t j = 0; j < v[0].size(); j++) t.set_item(static_cast<int64_t>(i * v[0].size() + j), v[i][j]);
  return t;
}

inline double sig(double x) {
  return 1.0 / (1.0 + std::exp(-x));
}

}  // namespace moecore::testing
