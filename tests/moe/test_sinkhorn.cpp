// Sinkhorn selection (moe/sinkhorn.h) against Megatron's moe_utils.sinkhorn written out in plain Python (f64) on a
// 4-token, 3-expert case whose balanced choice differs from the plain arg-max.
#include <gtest/gtest.h>

#include "moecore/moe/sinkhorn.h"

namespace moecore {
namespace {

TEST(Sinkhorn, MatchesMegatronsLoopOnAHandCase) {
  const double logits[4][3] = {{2.0, 0.5, -1.0}, {1.5, 0.2, 0.3}, {3.0, -0.5, 0.0}, {0.1, 0.0, -0.2}};
  // Python: the loop of megatron/core/transformer/moe/moe_utils.py sinkhorn(), tol 1e-4, float64.
  const double expected[4][3] = {{0.096123762345670077, 0.11833464782609859, 0.035540038761459447},
                                 {0.052739162947471628, 0.079300018850814447, 0.11796425685719525},
                                 {0.16271882153265999, 0.027110029368865342, 0.060162368631529496},
                                 {0.021751582704426502, 0.10858861630486252, 0.11966664084027356}};
  for (DType dt : {DType::F64, DType::F32}) {
    Tensor l = Tensor::empty({4, 3}, dt);
    for (int t = 0; t < 4; t++)
      for (int e = 0; e < 3; e++) l.set_item(t * 3 + e, logits[t][e]);
    const Tensor r = moe::sinkhorn_TE(l, nullptr);
    const double tol = dt == DType::F64 ? 1e-15 : 1e-7;  // f32 logits round 0.1, 0.2, 0.3
    for (int t = 0; t < 4; t++)
      for (int e = 0; e < 3; e++) EXPECT_NEAR(r.item(t * 3 + e), expected[t][e], tol) << t << "," << e;
  }
}

// At convergence every expert's column sums to 1/E (the last scaling, up to its 1e-8 epsilon) and every
// token's row to about 1/T.
TEST(Sinkhorn, BalancesRowsAndColumns) {
  const int64_t T = 16, E = 4;
  Tensor l = Tensor::empty({T, E}, DType::F32);
  for (int64_t i = 0; i < T * E; i++) l.set_item(i, (i % E == 0 ? 2.0 : 0.0) + 0.01 * static_cast<double>(i % 7));
  const Tensor r = moe::sinkhorn_TE(l, nullptr);
  for (int64_t e = 0; e < E; e++) {
    double col = 0;
    for (int64_t t = 0; t < T; t++) col += r.item(t * E + e);
    EXPECT_NEAR(col, 1.0 / E, 1e-7) << "expert " << e;
  }
  for (int64_t t = 0; t < T; t++) {
    double row = 0;
    for (int64_t e = 0; e < E; e++) row += r.item(t * E + e);
    EXPECT_NEAR(row, 1.0 / T, 1e-6) << "token " << t;
  }
}

}  // namespace
}  // namespace moecore
