// The flash kernels' small GEMM (kernels/cpu/attention_blocks.h) in its two forms: the AVX-512 one (64-byte vectors,
// 8-row register blocks) gives the bits of the other one (32-byte vectors, 6-row blocks; its x86-64-v4 copy, with FMA
// like the AVX-512 form) on every causal shape, row and column count (whole register blocks, rests, the scalar column
// tail), A row-major or transposed, stored or accumulated, in f32 and f64; and both give the plain triple loop on
// shapes whose sums are exact. Where the other form runs its baseline copy (clang's sanitized build, whose only copy
// it is: multiply and add round apart), the two agree to rounding instead.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "moecore/core/cpu.h"
#include "moecore/kernels/cpu/attention_blocks.h"
#include "test_util.h"

namespace moecore {
namespace {

using kernels::flash::Causal;
using kernels::flash::MatA;
using kernels::flash::MatB;
using kernels::flash::MatC;

template <typename T>
std::vector<T> bg_values(int64_t n, uint64_t seed) {
  const Tensor t = testing::randn({n}, DType::F64, seed);
  std::vector<T> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; i++) v[static_cast<size_t>(i)] = static_cast<T>(t.item(i));
  return v;
}

// C of both forms from the same start (random when accumulating), for A [M, K] (row-major or stored transposed).
template <typename T>
void bg_compare(int64_t M, int64_t N, int64_t K, bool a_transposed, bool accumulate, Causal mode) {
  constexpr int64_t ld = 72;  // row stride of every operand: wider than any N or K below
  std::vector<T> A = bg_values<T>(ld * ld, 1), B = bg_values<T>(ld * ld, 2);
  const std::vector<T> C0 = bg_values<T>(ld * ld, 3);
  const MatA<T> a = a_transposed ? MatA<T>{A.data(), 1, ld} : MatA<T>{A.data(), ld, 1};
  // The terms a causal mode skips are zero, as the kernels' masked probabilities are (each form skips them at its own
  // register-block granularity).
  for (int64_t i = 0; i < ld; i++)
    for (int64_t k = 0; k < ld; k++) {
      T& aik = A[static_cast<size_t>(a_transposed ? k * ld + i : i * ld + k)];
      if ((mode == Causal::KUpToRow && k > i) || (mode == Causal::KFromRow && k < i)) aik = 0;
      if (mode == Causal::KFromCol && i < k) B[static_cast<size_t>(i * ld + k)] = 0;  // B[k = i][j = k]
    }
  std::vector<T> c_any = C0, c_wide = C0;
  kernels::flash::block_gemm_any<T>(M, N, K, a, MatB<T>{B.data(), ld}, MatC<T>{c_any.data(), ld}, accumulate, mode);
  kernels::flash::block_gemm_avx512<T>(M, N, K, a, MatB<T>{B.data(), ld}, MatC<T>{c_wide.data(), ld}, accumulate, mode);
  // ColsUpToRow leaves a row block's columns past its last row unwritten: each form rounds them to its own vector.
  const double tol =
      clone_level() != CloneLevel::Baseline ? 0.0 : (sizeof(T) == 4 ? 2e-4 : 1e-12);  // ~64 terms of O(1)
  for (int64_t i = 0; i < M; i++)
    for (int64_t j = 0; j < (mode == Causal::ColsUpToRow ? std::min(N, i + 1) : N); j++) {
      const double x = c_any[static_cast<size_t>(i * ld + j)], y = c_wide[static_cast<size_t>(i * ld + j)];
      ASSERT_LE(std::fabs(x - y), tol * (1.0 + std::fabs(x)))
          << x << " vs " << y << ": M " << M << " N " << N << " K " << K << " transposed " << a_transposed
          << " accumulate " << accumulate << " mode " << static_cast<int>(mode) << " at (" << i << ", " << j << ")";
    }
}

TEST(FlashBlockGemm, Avx512FormGivesTheCloneFormsBits) {
  if (!kernels::flash::block_gemm_has_avx512()) GTEST_SKIP() << "this CPU has no AVX-512: one form runs";
  for (const Causal mode : {Causal::Full, Causal::ColsUpToRow, Causal::KUpToRow, Causal::KFromRow, Causal::KFromCol})
    for (const int64_t M : {int64_t{64}, int64_t{61}, int64_t{7}, int64_t{1}})
      for (const int64_t N : {int64_t{64}, int64_t{40}, int64_t{13}})
        for (const bool tr : {false, true})
          for (const bool acc : {false, true}) {
            const int64_t K = mode == Causal::Full ? 24 : M;  // the causal modes index k by row
            bg_compare<float>(M, N, K, tr, acc, mode);
            bg_compare<double>(M, N, K, tr, acc, mode);
          }
}

// Small integers: every product and sum is exact, so C is the triple loop's, whichever form runs.
TEST(FlashBlockGemm, ExactOnIntegers) {
  const int64_t M = 29, N = 37, K = 19;
  std::vector<float> A(M * K), B(K * N), C(M * N, 0.0f);
  for (int64_t i = 0; i < M * K; i++) A[static_cast<size_t>(i)] = static_cast<float>(i % 7 - 3);
  for (int64_t i = 0; i < K * N; i++) B[static_cast<size_t>(i)] = static_cast<float>(i % 5 - 2);
  kernels::flash::block_gemm<float>(M, N, K, MatA<float>{A.data(), K, 1}, MatB<float>{B.data(), N},
                                    MatC<float>{C.data(), N}, false);
  for (int64_t i = 0; i < M; i++)
    for (int64_t j = 0; j < N; j++) {
      float want = 0;
      for (int64_t k = 0; k < K; k++) want += A[static_cast<size_t>(i * K + k)] * B[static_cast<size_t>(k * N + j)];
      ASSERT_EQ(C[static_cast<size_t>(i * N + j)], want) << i << ", " << j;
    }
}

}  // namespace
}  // namespace moecore
