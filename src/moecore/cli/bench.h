// `moecore bench ...`: microbenchmarks that print achieved figures and their ratio to a roofline measured in the
// same run (the GEMM peak), because absolute times drift on shared machines.
#pragma once

#include <cstdint>

#include "moecore/core/dtype.h"

namespace moecore::cli {

struct GemmBenchResult {
  double gflops_best = 0;
  double gflops_median = 0;
};

// Square GEMM M=N=K=size with operands of `dtype` (f32 or bf16), `iters` timed runs after one warm-up.
GemmBenchResult bench_gemm(DType dtype, int64_t size, int iters);

struct AttentionBenchArgs {
  int64_t seq = 2048, batch = 1, heads = 8, kv_heads = 2, head_dim = 64;
  int iters = 3;
  int64_t gemm_size = 2048;
};
void run_bench_attention(const AttentionBenchArgs& a);
void run_bench_gemm(int64_t size, int iters);

}  // namespace moecore::cli
