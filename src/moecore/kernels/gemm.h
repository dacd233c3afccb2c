// Dense matrix multiply C = alpha·op(A)·op(B) + beta·C, the one GEMM every module uses.
// f32 and bf16 operands go to oneDNN matmul (f32 accumulation, f32 output; oneDNN chooses AVX-512/AMX/AVX2 at run
// time). f64 runs a plain blocked loop: it exists for finite-difference gradient checks, not for speed.
// Primitives are created once per shape and cached: a steady-state step creates none (gemm_stats() proves it).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "moecore/core/tensor.h"

namespace moecore::kernels {

// Tensors are seen as 2-D matrices [rows, cols] (leading dims flattened).
// op(A) is M×K: A is [M, K], or [K, M] when trans_a. op(B) is K×N: B is [K, N], or [N, K] when trans_b.
// C is [M, N], f32 for f32/bf16 operands, f64 for f64 operands. beta = 0 overwrites C, beta = 1 accumulates.
// With bf16 operands and beta 0, C may also be bf16: the f32 accumulation rounded as it is written (for an
// activation stored in bf16 between ops, with no cast pass of its own).
void gemm(const Tensor& A, bool trans_a, const Tensor& B, bool trans_b, Tensor& C, float alpha = 1.0f,
          float beta = 0.0f);

// Creates (and caches) the primitive gemm() would use for these sizes, without running it: for modules that know
// the bounded set of shapes they will use, so that no training step creates one. dtype: the operands' dtype; out:
// C's.
void gemm_prepare(int64_t M, int64_t N, int64_t K, bool trans_a, bool trans_b, DType dtype, float alpha = 1.0f,
                  float beta = 0.0f, DType out = DType::F32);

// A bf16 weight laid out once in the blocked layout oneDNN's bf16 matmul reads op(W) in, for the products C[M, N] =
// A[M, K]·op(W) a training step makes with it: each product then skips the copy into that layout oneDNN otherwise
// makes on every call (on AMX the copy of a 1024 x 1024 weight costs as much as multiplying it by 256 rows).
// Products whose primitive wants another layout (oneDNN chooses per shape) read `plain` instead; either way the
// result is the same product, deterministic for its shape.
struct PackedWeight {
  Tensor plain;  // W, bf16: [N, K] when trans (op(W) = Wᵀ), else [K, N]
  bool trans = false;
  Tensor packed;        // the blocked bytes; undefined where packing does not apply (products use `plain`)
  int64_t layout = -1;  // the blocked layout's index in the GEMM context's table
};
// Packs W for products with about `m` rows (the layout is oneDNN's choice for that shape), reusing `into`'s buffer.
// Packs nothing (only `plain` set) unless W is a bf16 CPU tensor on a CPU with bf16 matmul.
void pack_weight(const Tensor& W, bool trans, int64_t m, PackedWeight& into);
// C = A·op(W) + beta·C, C f32 (or bf16 with beta 0): gemm(A, false, W.plain, W.trans, C, 1, beta) with W's layout.
void gemm(const Tensor& A, const PackedWeight& W, Tensor& C, float beta = 0.0f);
// Whether a step of `micro_batches` micro-batches packs its bf16 expert weights (nn::Bf16WeightScope): where bf16
// matmul is native, from 4 micro-batches on, where each packed weight serves at least 4 forward and 4 backward
// products (AVX512-BF16, bench train with 8 micro-batches: +2.7% tokens/s; with 2 the reorders cost what the
// products gain; peak memory +13% at that size). MOECORE_PACK_WEIGHTS=on|off overrides the choice (auto: the rule
// above), for measuring a CPU.
bool pack_weights_for(int64_t micro_batches);
// The bytes pack_weight allocates for op(W) [K, N] (0 where it packs nothing).
int64_t packed_weight_bytes(int64_t K, int64_t N, bool trans, int64_t m);
// gemm_prepare for products with a packed weight.
void gemm_prepare_packed(int64_t M, int64_t N, int64_t K, bool trans_w, float beta = 0.0f, DType out = DType::F32);

// The same product for each of `batch` independent matrices in one call: A, B and C are [batch, rows, cols]
// (transposes apply to the last two dims). f32 and bf16 operands only.
void gemm_batched(const Tensor& A, bool trans_a, const Tensor& B, bool trans_b, Tensor& C, float alpha = 1.0f,
                  float beta = 0.0f);

// The roofline benchmarks and the trainer's logged MFU divide by (`bench train` samples its own between steps,
// cli/bench/train_run.cpp): the best rate (GFLOP/s) of square GEMMs of sizes
// 1024 and 2048 with operands of `dtype`, measured now (a second or two). Smaller sizes are left out: their
// operands stay in L2, which training GEMMs never do. On a GPU: the cuBLAS rate, best of 4096 and 8192.
double measure_gemm_peak_gflops(DType dtype, Device device = Device::cpu());
// max/min of peak samples taken during one run; above kUnsteadyPeak the machine's speed changed during the run (other
// work on it, clock changes) and every ratio to the peak moves with it: the benchmarks say so.
constexpr double kUnsteadyPeak = 1.25;
double peak_swing(const std::vector<double>& samples);
// Each timed run's rate over the mean of the two peak samples on either side of it (the last rates.size() + 1
// samples, in order, bracket the runs): on a machine whose speed drifts during a benchmark, each run compared with
// the peak of its moment. Empty where there are too few samples.
std::vector<double> paired_peak_ratios(const std::vector<double>& rates, const std::vector<double>& samples);
// The size n of the square GEMMs a benchmark's peak samples time on `d`: a GPU's cuBLAS peak needs products that fill
// it (8192); a CPU's shows at 2048.
int64_t peak_gemm_size(Device d);
// GFLOP/s of `iters` timed square M=N=K=n GEMMs after a warm-up: {best, median}.
std::pair<double, double> time_square_gemm(DType dtype, int64_t n, int iters, Device device = Device::cpu());

struct GemmStats {
  int64_t calls = 0;
  int64_t primitives_created = 0;
  double flops = 0, seconds = 0;  // oneDNN calls only: 2·M·N·K summed, and their wall time
  bool bf16_native = true;        // false when this CPU has no bf16 matmul and operands are widened to f32
  // The scratchpad buffer all primitives share and, where bf16 is widened, the f32 blocks of the widened products
  // (both outside the tensor allocator).
  int64_t scratchpad_bytes = 0;
};
GemmStats gemm_stats();

// The same per primitive shape (CPU oneDNN calls only), for seeing which of a step's GEMMs run below the peak: a
// long reduction's chunks count under their chunk's shape. Totals since the process started; a caller diffs two
// snapshots.
struct GemmShapeStats {
  int64_t batch = 0, M = 0, N = 0, K = 0;
  bool trans_a = false, trans_b = false, packed_b = false;
  DType dtype = DType::F32, out = DType::F32;
  float beta = 0;
  int64_t calls = 0;
  double flops = 0, seconds = 0;
  std::string describe() const;  // "M=256 N=2048 K=1024 (Bᵀ) bf16->bf16", with "+=" for beta 1 ("M=*" for M 0)
};
std::vector<GemmShapeStats> gemm_shape_stats();

}  // namespace moecore::kernels
