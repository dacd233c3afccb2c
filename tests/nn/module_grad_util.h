// The fp64 finite-difference check of a module (tests/nn/test_module_grads.cpp, test_mla_grads.cpp, ...).
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "moecore/kernels/elementwise.h"
#include "moecore/nn/parameter.h"
#include "test_util.h"

namespace moecore::testing {

// Checks d(Σ y⊙W)/dx and /dθ for a module given as forward(x) -> y and backward(dy) -> dx (x undefined: only the
// parameters).
template <typename Fwd, typename Bwd>
void check_module(nn::ParamRegistry& reg, Tensor& x, Fwd fwd, Bwd bwd, const std::string& what) {
  Tensor y = fwd();
  Tensor W = randn(y.shape(), DType::F64, 99);
  auto loss = [&] { return kernels::dot(fwd(), W); };
  reg.zero_grad();
  fwd();
  Tensor dx = bwd(W);
  if (x.defined()) {
    EXPECT_LT(fd_rel_error(loss, x, dx, 200), kGradTol) << what << ": input";
  }
  for (auto& p : reg.all()) EXPECT_LT(fd_rel_error(loss, p->value, p->grad, 60), kGradTol) << what << ": " << p->name;
}

}  // namespace moecore::testing
