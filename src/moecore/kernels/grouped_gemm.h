// Grouped expert GEMMs: one product per expert over that expert's block of expert-major rows, each expert with its
// own row count, experts without rows skipped. The grouped experts (moe/grouped_experts.cpp) run their four products
// per layer through these on both devices. The CPU backend runs each expert's rows in chunks of fixed-shape oneDNN
// products (row counts a multiple of grouped_gemm_row_align, primitives made by grouped_gemm_prepare); the GPU
// backend one cuBLASLt matmul per expert over streams. Not the dense GEMM (gemm.h).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "moecore/core/tensor.h"
#include "moecore/kernels/gemm.h"

namespace moecore::kernels {

// Expert e's op(W_e) as the CPU backend multiplies it in products of about `rows` rows (a packed bf16 copy made once
// per step, nn/parameter.h), asked for only for experts with rows; the GPU backend reads W as it is.
using ExpertWeightPacker = std::function<PackedWeight(int64_t e, int64_t rows)>;

// For every expert e with rows[e] > 0, rows [row_begin[e], row_begin[e] + rows[e]) of A and C:
//   C_e = A_e · W_eᵀ (trans_w: W [E, N, K]) or C_e = A_e · W_e (W [E, K, N]).
// A [R, K] and W one dtype (f32 or bf16; f32 accumulation), C [R, N] f32, or bf16 with bf16 operands (the f32
// accumulation rounded to nearest even as it is written); rows of C outside every expert's block are not written.
// `packed`, where given, supplies the CPU backend's weights (the same products).
void grouped_gemm(const Tensor& A_RK, const Tensor& W, bool trans_w, Tensor& C_RN,
                  const std::vector<int64_t>& row_begin, const std::vector<int64_t>& rows,
                  const ExpertWeightPacker* packed = nullptr);
// dW_e = beta·dW_e + dY_eᵀ · X_e for every expert with rows (dW f32 [E, N, K]; dY [R, N] and X [R, K] one dtype);
// experts without rows are left as they are.
void grouped_gemm_wgrad(const Tensor& dY_RN, const Tensor& X_RK, Tensor& dW_ENK, const std::vector<int64_t>& row_begin,
                        const std::vector<int64_t>& rows, float beta = 1.0f);

// The row alignment each expert's block should have on `d` for the fastest products (the CPU's fixed-shape
// primitives: 32; the GPU: 1, any row count). Rows between blocks are the caller's (zero rows add nothing).
int64_t grouped_gemm_row_align(Device d);
// Creates the primitives every aligned row count of these products will use on the CPU, so that no step creates one
// (nothing to do on a GPU): C[m, N] = A[m, K]·op(W) with operands `dtype` and output `out` (with packed weights too
// where `packed`), and the weight gradient dW[N, K] += dY[m, N]ᵀ·X[m, K].
void grouped_gemm_prepare(int64_t N, int64_t K, bool trans_w, DType dtype, DType out, bool packed);
void grouped_gemm_wgrad_prepare(int64_t N, int64_t K, DType dtype);

// gemm.h's and this header's entry points as one backend implements them (kernels/cpu/grouped_gemm.cpp,
// kernels/cuda/grouped_gemm.cpp), each with the signature of the op it is named after; kernels/dispatch.cpp picks the
// table of the operands' device.
struct GemmKernels {
  void (*gemm)(const Tensor& A, bool trans_a, const Tensor& B, bool trans_b, Tensor& C, float alpha, float beta);
  void (*gemm_batched)(const Tensor& A, bool trans_a, const Tensor& B, bool trans_b, Tensor& C, float alpha,
                       float beta);
  void (*grouped_gemm)(const Tensor& A_RK, const Tensor& W, bool trans_w, Tensor& C_RN,
                       const std::vector<int64_t>& row_begin, const std::vector<int64_t>& rows,
                       const ExpertWeightPacker* packed);
  void (*grouped_gemm_wgrad)(const Tensor& dY_RN, const Tensor& X_RK, Tensor& dW_ENK,
                             const std::vector<int64_t>& row_begin, const std::vector<int64_t>& rows, float beta);
  int64_t (*grouped_gemm_row_align)();
};

}  // namespace moecore::kernels
