// The GPU variants of `moecore bench gemm` and `bench attention` (--device cuda): timed with the host clock around
// stream synchronisations, through the same kernel entry points training uses.
#pragma once

#include <cstdint>

#include "moecore/core/device.h"

namespace moecore::cli {

// f32 (TF32 off) and bf16 GEMM TFLOP/s at M=N=K=size, and the cuBLAS bf16 peak (best over 4096 and 8192).
void run_bench_gemm_gpu(Device d, int64_t size, int iters);
// Causal GQA attention forward and forward+backward, f32 and bf16-rounded, and the ratio to the same-run cuBLAS
// bf16 peak. bf16: the backend kernels::attention_backend() picks (cuDNN's fused attention where it loads) and, when
// that is cuDNN, the native kernels in runs alternating with it, with the speedup. dropout > 0: also with attention
// dropout p, in runs alternating with the plain ones, and the time ratio.
void run_bench_attention_gpu(Device d, int64_t seq, int64_t batch, int64_t heads, int64_t kv_heads, int64_t head_dim,
                             int iters, bool bf16, double dropout = 0);
// The cuBLAS bf16 GEMM peak in GFLOP/s measured now: best of 3 runs at each of M=N=K=4096 and 8192.
double gpu_bf16_peak_gflops(Device d);

}  // namespace moecore::cli
