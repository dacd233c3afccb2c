// The GEMM rate of `moecore plan --plan-gpu` at an op's shape (train/plan/op_costs.h, gemm_kernel_seconds): the
// H100's and B200's two fitted constants against the points of the table they were fitted to, and the H100's against
// published kernel times that were not used to fit them (docs/plan.md, "Rates").
#include <gtest/gtest.h>

#include "moecore/train/plan/gpu_specs.h"
#include "moecore/train/plan/op_costs.h"

namespace moecore::train::plan {
namespace {

double tflops(double m, double n, double k, bool grouped, const char* gpu = "h100") {
  const GpuSpec& g = gpu_spec(gpu);
  return 2 * m * n * k / gemm_kernel_seconds(g, m, n, k, g.achievable_bf16(), grouped) / 1e12;
}

// XLA's published sm_90 GEMM table (BF16, one GEMM, median kernel time), the table the constants were fitted to:
// within 10% at the shapes a layer's GEMMs take, large and small.
TEST(PlanGemmRate, NearTheFittedTable) {
  struct Point {
    double m, n, k, measured;
  };
  for (const Point& p : {Point{4096, 4096, 4096, 780.2}, Point{4096, 2048, 2048, 727.5}, Point{2048, 2048, 2048, 641.0},
                         Point{4096, 1024, 2048, 643.7}, Point{4096, 2048, 512, 449.6}, Point{4096, 4096, 1024, 685.2}})
    EXPECT_NEAR(tflops(p.m, p.n, p.k, false) / p.measured, 1.0, 0.10) << p.m << " x " << p.n << " x " << p.k;
}

// The B200's constants against the same table's sm_100 entries (B200): within 10% too.
TEST(PlanGemmRate, B200NearTheFittedTable) {
  struct Point {
    double m, n, k, measured;
  };
  for (const Point& p :
       {Point{4096, 4096, 4096, 1416.9}, Point{4096, 2048, 2048, 1170.0}, Point{2048, 2048, 2048, 985.8},
        Point{4096, 2048, 512, 652.3}, Point{4096, 4096, 1024, 1075.6}})
    EXPECT_NEAR(tflops(p.m, p.n, p.k, false, "b200") / p.measured, 1.0, 0.10) << p.m << " x " << p.n << " x " << p.k;
}

// TransformerEngine's grouped GEMM (multi-stream cuBLAS) on H100, TransformerEngine pull request 2045 (TE 2.7,
// CUDA 12.9): 8 experts of 4,096 rows (Qwen3-30B-A3B's on EP 16) at 627.9 TFLOPS, 16 of 2,048 rows at 553.9, with
// N 768 and K 2048. The model's per-expert kernel with the grouped share of the fixed part: within 5% of both.
TEST(PlanGemmRate, GroupedNearTransformerEnginesPublishedShapes) {
  EXPECT_NEAR(tflops(4096, 768, 2048, true) / 627.9, 1.0, 0.05);
  EXPECT_NEAR(tflops(2048, 768, 2048, true) / 553.9, 1.0, 0.05);
  // One expert's GEMM alone (no streams beside it) is slower: the grouped GEMM hides part of each fixed cost.
  EXPECT_LT(tflops(4096, 768, 2048, false), tflops(4096, 768, 2048, true));
}

// cuBLAS through torch.mm on H100 80GB HBM3 at DeepSeek-V3's N 2112, K 7168 (vLLM pull request 23280, the torch-bf16
// column): 619.8 TFLOPS at M 1024, 648.2 at 2048, 715.8 at 4096. The model is up to 20% faster there, never slower:
// against that benchmark its rates err on the optimistic side.
TEST(PlanGemmRate, DenseWithinAFifthOfAnIndependentCublasBenchmark) {
  for (const auto& [m, measured] : {std::pair{1024.0, 619.8}, {2048.0, 648.2}, {4096.0, 715.8}}) {
    const double r = tflops(m, 2112, 7168, false) / measured;
    EXPECT_GE(r, 1.0) << m;
    EXPECT_LE(r, 1.2) << m;
  }
}

// The rate rises with the shape towards MAMF, the large-shape measurement, and never passes it.
TEST(PlanGemmRate, RisesTowardsMamfAndStaysBelow) {
  const GpuSpec& g = gpu_spec("h100");
  double last = 0;
  for (double s : {256.0, 512.0, 1024.0, 2048.0, 4096.0, 16384.0}) {
    const double r = tflops(s, s, s, false);
    EXPECT_GT(r, last) << s;
    EXPECT_LT(r * 1e12, g.achievable_bf16()) << s;
    last = r;
  }
  EXPECT_GT(last * 1e12, 0.95 * g.achievable_bf16());
}

}  // namespace
}  // namespace moecore::train::plan
