// cuDNN's fused attention (kernels/cuda/attention_cudnn*.cpp) on a GPU: forward and backward against the CPU bf16
// kernel within the bf16 tolerance the tensor-core tests use (2e-2 of the reference's largest magnitude), at D 64,
// 128 and MLA's 192/128, causal, GQA 32/4, 8/1 and MHA, sequences off the tile sizes; bitwise-identical reruns of the
// forward and the backward (cuDNN's deterministic backward); the lse convention shared with the native kernels (a
// cuDNN forward followed by the native backward still matches the CPU); and the route: bf16 calls without dropout go
// to cuDNN, with dropout or the native backend they do not. Outputs are poisoned with NaN first, so an element cuDNN
// leaves unwritten fails. A GPU machine without a loadable cuDNN fails here (naming why), not skips.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include "cuda/gpu_util.h"
#include "cuda/kernel_compare.h"
#include "moecore/device/runtime.h"
#include "moecore/kernels/attention.h"
#include "moecore/kernels/attention_backend.h"
#include "moecore/kernels/cuda/attention_cudnn.h"
#include "moecore/kernels/cuda/attention_cudnn_api.h"

namespace moecore::kernels {
namespace {

using testing_cuda::bitwise_equal;
using testing_cuda::gpu;
using testing_cuda::host_random;
using testing_cuda::rel_diff;
using testing_cuda::ScopedAttentionBackend;
using testing_cuda::trace;

constexpr double kCudnnTol = 2e-2;  // as CudaAttentionTc: bf16 operands and P, f32 accumulation in other orders

// Dv < D: MLA's value heads, the first Dv channels of rows D wide whose other channels are zero.
struct CudnnCase {
  int64_t S, B, Nq, Nkv, D, Dv;
  std::string str() const {
    return "S=" + std::to_string(S) + " B=" + std::to_string(B) + " heads=" + std::to_string(Nq) + "/" +
           std::to_string(Nkv) + " D=" + std::to_string(D) + " Dv=" + std::to_string(Dv);
  }
};

const CudnnCase kCudnnCases[] = {{256, 2, 4, 4, 64, 64}, {1000, 1, 8, 8, 128, 128}, {512, 1, 32, 4, 128, 128},
                                 {333, 2, 8, 1, 64, 64}, {200, 2, 4, 4, 192, 128},  {300, 1, 4, 4, 192, 192},
                                 {17, 2, 4, 2, 128, 128}};

// A GPU tensor of NaN.
Tensor nan_gpu(const Shape& s) {
  Tensor t = Tensor::empty(s, DType::F32);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); i++) p[i] = std::numeric_limits<float>::quiet_NaN();
  return t.to(Device::cuda());
}

// Random values in the first Dv channels of each D-wide row, zeros after (MLA's padded v and dO).
Tensor padded_random(const Shape& s, int64_t Dv, uint64_t seed) {
  Tensor t = host_random(s, seed);
  const int64_t D = s[s.ndim() - 1];
  for (int64_t i = 0; i < t.numel(); i++)
    if (i % D >= Dv) t.set_item(i, 0.0);
  return t;
}

struct CudnnInputs {
  Tensor q, k, v, dout, gq, gk, gv, gd;
  double scale;
  explicit CudnnInputs(const CudnnCase& c)
      : q(host_random({c.S, c.B, c.Nq, c.D}, 51)),
        k(host_random({c.S, c.B, c.Nkv, c.D}, 52)),
        v(padded_random({c.S, c.B, c.Nkv, c.D}, c.Dv, 53)),
        dout(padded_random({c.S, c.B, c.Nq, c.D}, c.Dv, 54)),
        gq(gpu(q)),
        gk(gpu(k)),
        gv(gpu(v)),
        gd(gpu(dout)),
        scale(1.0 / std::sqrt(static_cast<double>(c.D))) {}
};

struct CudnnOutputs {
  Tensor o, lse, dq, dk, dv;
  CudnnOutputs(const CudnnCase& c, bool on_gpu) {
    const Shape qs{c.S, c.B, c.Nq, c.D}, ks{c.S, c.B, c.Nkv, c.D}, ls{c.B, c.Nq, c.S};
    auto make = [on_gpu](const Shape& s) { return on_gpu ? nan_gpu(s) : Tensor::empty(s, DType::F32); };
    o = make(qs), lse = make(ls), dq = make(qs), dk = make(ks), dv = make(ks);
  }
};

CudnnOutputs cpu_reference(const CudnnCase& c, const CudnnInputs& in) {
  CudnnOutputs r(c, false);
  trace(c.str() + ": CPU reference");
  attention_forward_bf16(in.q, in.k, in.v, in.scale, r.o, r.lse);
  attention_backward_bf16(in.dout, in.q, in.k, in.v, r.o, r.lse, in.scale, r.dq, r.dk, r.dv);
  return r;
}

// cuDNN's path called directly (with Dv), asserting it ran.
CudnnOutputs run_cudnn(const CudnnCase& c, const CudnnInputs& in) {
  CudnnOutputs r(c, true);
  trace(c.str() + ": cuDNN forward");
  EXPECT_TRUE(cuda::cudnn_attention_forward(in.gq, in.gk, in.gv, c.Dv, in.scale, r.o, r.lse, nullptr))
      << c.str() << ": cuDNN did not run the forward (its reason is on stderr)";
  trace(c.str() + ": cuDNN backward");
  EXPECT_TRUE(
      cuda::cudnn_attention_backward(in.gd, in.gq, in.gk, in.gv, r.o, r.lse, c.Dv, in.scale, r.dq, r.dk, r.dv, nullptr))
      << c.str() << ": cuDNN did not run the backward (its reason is on stderr)";
  ::moecore::device::synchronize();
  return r;
}

std::string cudnn_errors(const CudnnOutputs& got, const CudnnOutputs& want, bool* ok) {
  const double e[5] = {rel_diff(got.o, want.o), rel_diff(got.lse, want.lse), rel_diff(got.dq, want.dq),
                       rel_diff(got.dk, want.dk), rel_diff(got.dv, want.dv)};
  *ok = true;
  for (double x : e) *ok = *ok && x < kCudnnTol;  // NaN fails
  return "o " + std::to_string(e[0]) + ", lse " + std::to_string(e[1]) + ", dq " + std::to_string(e[2]) + ", dk " +
         std::to_string(e[3]) + ", dv " + std::to_string(e[4]);
}

#define MOE_REQUIRE_CUDNN()                                                                                   \
  do {                                                                                                        \
    std::string moe_cudnn_why_;                                                                               \
    ASSERT_TRUE(cuda::cudnn_attention_available(&moe_cudnn_why_)) << "cuDNN unavailable: " << moe_cudnn_why_; \
  } while (0)

TEST(CudaAttentionCudnn, MatchesTheCpuBf16Kernel) {
  MOE_REQUIRE_GPU();
  MOE_REQUIRE_CUDNN();
  for (const CudnnCase& c : kCudnnCases) {
    const CudnnInputs in(c);
    const CudnnOutputs want = cpu_reference(c, in), got = run_cudnn(c, in);
    bool ok = false;
    const std::string msg = cudnn_errors(got, want, &ok);
    EXPECT_TRUE(ok) << c.str() << ": relative errors vs the CPU bf16 kernel " << msg << " (tolerance " << kCudnnTol
                    << "; nan = an element left unwritten)";
  }
}

TEST(CudaAttentionCudnn, RerunsAreBitwiseIdentical) {
  MOE_REQUIRE_GPU();
  MOE_REQUIRE_CUDNN();
  for (const CudnnCase& c : kCudnnCases) {
    const CudnnInputs in(c);
    const CudnnOutputs a = run_cudnn(c, in), b = run_cudnn(c, in), d = run_cudnn(c, in);
    EXPECT_TRUE(bitwise_equal(a.o, b.o) && bitwise_equal(a.lse, b.lse)) << c.str() << ": forward differs on a rerun";
    EXPECT_TRUE(bitwise_equal(a.dq, b.dq) && bitwise_equal(a.dk, b.dk) && bitwise_equal(a.dv, b.dv) &&
                bitwise_equal(a.dq, d.dq) && bitwise_equal(a.dk, d.dk) && bitwise_equal(a.dv, d.dv))
        << c.str() << ": backward differs on a rerun (cuDNN's backward must be its deterministic algorithm)";
  }
}

// o and lse mean the same on both paths: the native backward after cuDNN's forward matches the CPU.
TEST(CudaAttentionCudnn, NativeBackwardAfterACudnnForwardMatchesTheCpu) {
  MOE_REQUIRE_GPU();
  MOE_REQUIRE_CUDNN();
  for (const CudnnCase& c : {CudnnCase{512, 1, 32, 4, 128, 128}, CudnnCase{256, 2, 4, 4, 64, 64}}) {
    const CudnnInputs in(c);
    const CudnnOutputs want = cpu_reference(c, in);
    CudnnOutputs got(c, true);
    ASSERT_TRUE(cuda::cudnn_attention_forward(in.gq, in.gk, in.gv, c.Dv, in.scale, got.o, got.lse, nullptr));
    {
      const ScopedAttentionBackend native(AttentionBackend::kNative);
      attention_backward_bf16(in.gd, in.gq, in.gk, in.gv, got.o, got.lse, in.scale, got.dq, got.dk, got.dv);
    }
    bool ok = false;
    const std::string msg = cudnn_errors(got, want, &ok);
    EXPECT_TRUE(ok) << c.str() << ": " << msg;
  }
}

// The public bf16 entry points: cuDNN under auto and cudnn, the native kernels under native and with dropout.
TEST(CudaAttentionCudnn, EntryPointsRouteBf16CallsWithoutDropoutToCudnn) {
  MOE_REQUIRE_GPU();
  MOE_REQUIRE_CUDNN();
  const CudnnCase c{256, 1, 8, 2, 128, 128};
  const CudnnInputs in(c);
  const CudnnOutputs direct = run_cudnn(c, in);
  for (AttentionBackend b : {AttentionBackend::kAuto, AttentionBackend::kCudnn, AttentionBackend::kNative}) {
    const ScopedAttentionBackend scope(b);
    const cuda::CudnnAttentionCounts before = cuda::cudnn_attention_counts();
    CudnnOutputs r(c, true);
    attention_forward_bf16(in.gq, in.gk, in.gv, in.scale, r.o, r.lse);
    attention_backward_bf16(in.gd, in.gq, in.gk, in.gv, r.o, r.lse, in.scale, r.dq, r.dk, r.dv);
    const cuda::CudnnAttentionCounts after = cuda::cudnn_attention_counts();
    const bool cudnn = b != AttentionBackend::kNative;
    EXPECT_EQ(after.forward - before.forward, cudnn ? 1 : 0) << attention_backend_name(b);
    EXPECT_EQ(after.backward - before.backward, cudnn ? 1 : 0) << attention_backend_name(b);
    if (cudnn) {
      EXPECT_TRUE(bitwise_equal(r.o, direct.o) && bitwise_equal(r.dq, direct.dq) && bitwise_equal(r.dk, direct.dk))
          << attention_backend_name(b) << ": the entry points' results are not cuDNN's";
    }
  }
  // Dropout keeps the native kernels (moecore's Philox mask), whatever the backend.
  const ScopedAttentionBackend scope(AttentionBackend::kCudnn);
  const cuda::CudnnAttentionCounts before = cuda::cudnn_attention_counts();
  const int64_t samples[1] = {0};
  AttentionDropout drop;
  drop.mask = DropoutMask::make(1234, 5, 0.1);
  drop.sample_B = samples;
  CudnnOutputs r(c, true);
  attention_forward_bf16(in.gq, in.gk, in.gv, in.scale, r.o, r.lse, &drop);
  attention_backward_bf16(in.gd, in.gq, in.gk, in.gv, r.o, r.lse, in.scale, r.dq, r.dk, r.dv, &drop);
  EXPECT_EQ(cuda::cudnn_attention_counts().forward, before.forward);
  EXPECT_EQ(cuda::cudnn_attention_counts().backward, before.backward);
}

}  // namespace
}  // namespace moecore::kernels
