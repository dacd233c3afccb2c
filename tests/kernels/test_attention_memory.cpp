// Attention at S=4096 never allocates an S×S buffer: the allocator's peak during forward+backward stays a small
// multiple of the inputs, far below one S×S score matrix.
#include <gtest/gtest.h>

#include "moecore/core/allocator.h"
#include "moecore/kernels/cpu/attention.h"
#include "test_util.h"

namespace moecore {
namespace {

TEST(AttentionMemory, NoSxSBufferAtS4096) {
  const int64_t S = 4096, B = 1, Nq = 2, Nkv = 1, D = 16;
  Tensor q = testing::randn({S, B, Nq, D}, DType::F32, 1), k = testing::randn({S, B, Nkv, D}, DType::F32, 2);
  Tensor v = testing::randn({S, B, Nkv, D}, DType::F32, 3), g = testing::randn(q.shape(), DType::F32, 4);
  Tensor o = Tensor::empty(q.shape(), DType::F32), lse = Tensor::empty({B, Nq, S}, DType::F32);
  Tensor dq = Tensor::empty(q.shape(), DType::F32), dk = Tensor::empty(k.shape(), DType::F32),
         dv = Tensor::empty(v.shape(), DType::F32);
  Allocator& a = Allocator::instance();
  a.reset_peak();
  const int64_t base = a.stats().live_bytes;
  kernels::attention_forward(q, k, v, 0.25, o, lse);
  kernels::attention_backward(g, q, k, v, o, lse, 0.25, dq, dk, dv);
  const int64_t extra = a.stats().peak_bytes - base;
  const int64_t sxs = S * S * static_cast<int64_t>(sizeof(float));  // 64 MiB
  // Scratch is per thread tiles plus one [B, Nq, S] row statistic: a few hundred KiB.
  EXPECT_LT(extra, sxs / 64) << "attention used " << extra << " extra bytes";
  EXPECT_LT(extra, 2 * 1024 * 1024);
  // The result is a real attention: outputs are finite and row 0 attends only to key 0 (o_0 = v_0).
  for (int64_t d = 0; d < D; d++) EXPECT_NEAR(o.item(d), v.item(d), 1e-6);
  for (int64_t i = 0; i < o.numel(); i += 997) EXPECT_TRUE(std::isfinite(o.item(i)));
}

// The bf16-GEMM attention holds query blocks' scores for a bounded chunk of heads: at S=4096 its peak extra memory
// stays below half of one S×S f32 matrix (64 MiB), and row 0 still attends only to key 0.
TEST(AttentionMemory, Bf16KernelHoldsNoSxSMatrixAtS4096) {
  const int64_t S = 4096, B = 1, Nq = 2, Nkv = 1, D = 16;
  Tensor q = testing::randn({S, B, Nq, D}, DType::F32, 1), k = testing::randn({S, B, Nkv, D}, DType::F32, 2);
  Tensor v = testing::randn({S, B, Nkv, D}, DType::F32, 3), g = testing::randn(q.shape(), DType::F32, 4);
  Tensor o = Tensor::empty(q.shape(), DType::F32), lse = Tensor::empty({B, Nq, S}, DType::F32);
  Tensor dq = Tensor::empty(q.shape(), DType::F32), dk = Tensor::empty(k.shape(), DType::F32),
         dv = Tensor::empty(v.shape(), DType::F32);
  Allocator& a = Allocator::instance();
  a.reset_peak();
  const int64_t base = a.stats().live_bytes;
  kernels::attention_forward_bf16(q, k, v, 0.25, o, lse);
  kernels::attention_backward_bf16(g, q, k, v, o, lse, 0.25, dq, dk, dv);
  const int64_t extra = a.stats().peak_bytes - base;
  EXPECT_LT(extra, S * S * static_cast<int64_t>(sizeof(float)) / 2) << "attention used " << extra << " extra bytes";
  for (int64_t d = 0; d < D; d++) EXPECT_NEAR(o.item(d), v.item(d), 1e-2 * std::fabs(v.item(d)) + 1e-6);
}

}  // namespace
}  // namespace moecore
