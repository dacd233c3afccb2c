// Megatron's --bf16 memory layout, shown by the allocator on one rank: the model holds its GEMM weights in bf16
// (2 bytes) and the rest in f32, fp32 main gradients (4), and the optimizer the fp32 masters of the bf16 weights (4)
// and both moments (8): 18 bytes per bf16 parameter, 16 per f32 one; without --bf16, 16 for every parameter.
// DP2 under the distributed optimizer (6 + 12/DP): tests/mpi/test_mixed_precision_layouts.cpp.
#include <gtest/gtest.h>

#include "config_util.h"
#include "optim/state_bytes.h"

namespace moecore {
namespace {

using testing::operator+;

TEST(MixedPrecisionBytes, Bf16IsEighteenBytesPerParameterReplicated) {
  const testing::StateBytes s =
      testing::state_bytes(testing::small_config(testing::state_bytes_model(), {"--bf16"}), nullptr);
  testing::expect_layout(s, "bf16, one rank", 0.02);
  EXPECT_NEAR(s.measured / s.params, 18.0, 0.25);  // the f32-kept norms, router and embedding take 16
}

TEST(MixedPrecisionBytes, Fp32IsSixteenBytesPerParameter) {
  const testing::StateBytes s = testing::state_bytes(testing::small_config(testing::state_bytes_model()), nullptr);
  std::printf("fp32, one rank: %.3f bytes per parameter measured, %.3f planned\n", s.measured / s.params,
              s.planned / s.params);
  EXPECT_EQ(s.bf16_params, 0);
  EXPECT_NEAR(s.measured, 16.0 * s.params, 0.02 * 16.0 * s.params);
  EXPECT_NEAR(s.planned, 16.0 * s.params, 0.02 * 16.0 * s.params);
}

}  // namespace
}  // namespace moecore
