// The tensor-core attention kernels (bf16 path, D 64 and 128): against the CPU bf16 kernel and the warp-per-row GPU
// kernel on shapes with S off the tile sizes (1, 17, 200, 1000), GQA and B = 2, within 2e-2 of the reference's
// largest magnitude; bitwise-identical reruns; outputs poisoned with NaN before every run, so an element a kernel
// fails to write shows up. Also: the bf16 entry points take the tensor-core path exactly where it applies. The
// entry points run with the native backend (cuDNN's fused attention has its own tests, test_cuda_attention_cudnn.cpp).
// Skipped (one line) without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "cuda/gpu_util.h"
#include "cuda/kernel_compare.h"
#include "moecore/device/runtime.h"
#include "moecore/kernels/attention.h"

#ifdef MOECORE_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "moecore/device/stream.h"
#include "moecore/kernels/cuda/launch_attention_tc.h"
#endif

namespace moecore::kernels {
namespace {

using testing_cuda::bitwise_equal;
using testing_cuda::gpu;
using testing_cuda::host_random;
using testing_cuda::rel_diff;
using testing_cuda::ScopedAttentionBackend;
using testing_cuda::trace;

constexpr double kTol = 2e-2;  // bf16 P rounded before (GPU) or after (CPU) normalisation; f32 sums in other orders

struct Case {
  int64_t S, B, Nq, Nkv, D;
  std::string str() const {
    return "S=" + std::to_string(S) + " B=" + std::to_string(B) + " Nq=" + std::to_string(Nq) +
           " Nkv=" + std::to_string(Nkv) + " D=" + std::to_string(D);
  }
};

// One sequence with 8 (and 4) query heads per kv head: the dK/dV kernel splits the group's heads over blocks
// (attention_tc_dkv_splits 8 and 4); the others split by 2 or 4 too, except Nq = Nkv.
const Case kCases[] = {{1, 2, 2, 1, 64},    {17, 2, 4, 2, 128},   {200, 2, 4, 1, 64},  {200, 2, 2, 2, 128},
                       {1000, 2, 4, 2, 64}, {1000, 2, 4, 2, 128}, {512, 1, 8, 1, 128}, {333, 1, 8, 2, 64}};

// A GPU tensor full of NaN: an element no kernel writes stays NaN and fails every comparison.
Tensor poisoned(const Shape& s) {
  Tensor t = Tensor::empty(s, DType::F32);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); i++) p[i] = std::numeric_limits<float>::quiet_NaN();
  return t.to(Device::cuda());
}

struct Inputs {
  Tensor q, k, v, dout;   // host
  Tensor gq, gk, gv, gd;  // device
  double scale;
  explicit Inputs(const Case& c)
      : q(host_random({c.S, c.B, c.Nq, c.D}, 31)),
        k(host_random({c.S, c.B, c.Nkv, c.D}, 32)),
        v(host_random({c.S, c.B, c.Nkv, c.D}, 33)),
        dout(host_random({c.S, c.B, c.Nq, c.D}, 34)),
        gq(gpu(q)),
        gk(gpu(k)),
        gv(gpu(v)),
        gd(gpu(dout)),
        scale(1.0 / std::sqrt(static_cast<double>(c.D))) {}
};

struct Outputs {
  Tensor o, lse, dq, dk, dv;
  Outputs(const Case& c, bool on_gpu) {
    const Shape qs{c.S, c.B, c.Nq, c.D}, ks{c.S, c.B, c.Nkv, c.D}, ls{c.B, c.Nq, c.S};
    if (on_gpu) {
      o = poisoned(qs), lse = poisoned(ls), dq = poisoned(qs), dk = poisoned(ks), dv = poisoned(ks);
    } else {
      o = Tensor::empty(qs, DType::F32), lse = Tensor::empty(ls, DType::F32), dq = Tensor::empty(qs, DType::F32);
      dk = Tensor::empty(ks, DType::F32), dv = Tensor::empty(ks, DType::F32);
    }
  }
};

// The public bf16 entry points on the GPU (the tensor-core path for D 64/128).
Outputs run_gpu(const Case& c, const Inputs& in) {
  Outputs r(c, true);
  trace(c.str() + ": GPU forward");
  attention_forward_bf16(in.gq, in.gk, in.gv, in.scale, r.o, r.lse);
  trace(c.str() + ": GPU backward");
  attention_backward_bf16(in.gd, in.gq, in.gk, in.gv, r.o, r.lse, in.scale, r.dq, r.dk, r.dv);
  ::moecore::device::synchronize();
  trace(c.str() + ": GPU done");
  return r;
}

std::string errors(const Outputs& got, const Outputs& want, double (&e)[5]) {
  e[0] = rel_diff(got.o, want.o), e[1] = rel_diff(got.lse, want.lse), e[2] = rel_diff(got.dq, want.dq);
  e[3] = rel_diff(got.dk, want.dk), e[4] = rel_diff(got.dv, want.dv);
  return "o " + std::to_string(e[0]) + ", lse " + std::to_string(e[1]) + ", dq " + std::to_string(e[2]) + ", dk " +
         std::to_string(e[3]) + ", dv " + std::to_string(e[4]);
}

bool all_below(const double (&e)[5], double tol) {
  for (double x : e)
    if (!(x < tol)) return false;  // NaN (an unwritten element) fails too
  return true;
}

TEST(CudaAttentionTc, MatchesTheCpuBf16Kernel) {
  MOE_REQUIRE_GPU();
  const ScopedAttentionBackend native(AttentionBackend::kNative);
  for (const Case& c : kCases) {
    const Inputs in(c);
    Outputs want(c, false);
    trace(c.str() + ": CPU reference");
    attention_forward_bf16(in.q, in.k, in.v, in.scale, want.o, want.lse);
    attention_backward_bf16(in.dout, in.q, in.k, in.v, want.o, want.lse, in.scale, want.dq, want.dk, want.dv);
    const Outputs got = run_gpu(c, in);
    double e[5];
    const std::string msg = errors(got, want, e);
    EXPECT_TRUE(all_below(e, kTol)) << c.str() << ": relative errors vs the CPU bf16 kernel " << msg << " (tolerance "
                                    << kTol << "; nan = an element left unwritten)";
  }
}

TEST(CudaAttentionTc, RerunsAreBitwiseIdentical) {
  MOE_REQUIRE_GPU();
  const ScopedAttentionBackend native(AttentionBackend::kNative);
  for (const Case& c : kCases) {
    const Inputs in(c);
    const Outputs a = run_gpu(c, in), b = run_gpu(c, in);
    EXPECT_TRUE(bitwise_equal(a.o, b.o) && bitwise_equal(a.lse, b.lse)) << c.str() << ": forward differs on a rerun";
    EXPECT_TRUE(bitwise_equal(a.dq, b.dq) && bitwise_equal(a.dk, b.dk) && bitwise_equal(a.dv, b.dv))
        << c.str() << ": backward differs on a rerun";
  }
}

#ifdef MOECORE_HAVE_CUDA
// The kernels behind the dispatch, called directly: tc = the tensor-core launchers, else the warp-per-row ones.
Outputs run_launchers(const Case& c, const Inputs& in, bool tc) {
  Outputs r(c, true);
  Tensor delta = poisoned({c.B, c.Nq, c.S});
  const cudaStream_t s = ::moecore::device::current_stream();
  const float sc = static_cast<float>(in.scale);
  const float *q = in.gq.device_data<float>(), *k = in.gk.device_data<float>(), *v = in.gv.device_data<float>(),
              *d = in.gd.device_data<float>();
  float *o = r.o.device_data<float>(), *lse = r.lse.device_data<float>();
  float *dq = r.dq.device_data<float>(), *dk = r.dk.device_data<float>(), *dv = r.dv.device_data<float>();
  trace(c.str() + (tc ? ": tensor-core launchers" : ": warp-per-row launchers"));
  if (tc) {
    launch::attention_tc_forward(q, k, v, o, lse, c.S, c.B, c.Nq, c.Nkv, c.D, sc, launch::DropoutParams{}, s);
    launch::attention_delta(d, o, delta.device_data<float>(), c.S, c.B, c.Nq, c.D, s);
    const int64_t part = launch::attention_tc_dkv_part_floats(c.S, c.B, c.Nq, c.Nkv, c.D);
    Tensor dkv_part = poisoned({std::max<int64_t>(part, 1)});
    launch::attention_tc_backward(d, q, k, v, lse, delta.device_data<float>(), dq, dk, dv,
                                  part > 0 ? dkv_part.device_data<float>() : nullptr, c.S, c.B, c.Nq, c.Nkv, c.D, sc,
                                  launch::DropoutParams{}, s);
  } else {
    launch::attention_rowwise_forward(q, k, v, o, lse, c.S, c.B, c.Nq, c.Nkv, c.D, sc, true, launch::DropoutParams{},
                                      s);
    launch::attention_rowwise_backward(d, q, k, v, o, lse, dq, dk, dv, delta.device_data<float>(), c.S, c.B, c.Nq,
                                       c.Nkv, c.D, sc, true, launch::DropoutParams{}, s);
  }
  const cudaError_t err = cudaStreamSynchronize(s);
  EXPECT_EQ(err, cudaSuccess) << c.str() << ": " << cudaGetErrorString(err);
  const cudaError_t last = cudaGetLastError();
  EXPECT_EQ(last, cudaSuccess) << c.str() << ": " << cudaGetErrorString(last);
  return r;
}

// Host-only: how many blocks share a key tile's dK/dV depends on the shape alone (so do the bits), divides the group,
// and lifts the Qwen3-MoE benchmark's one-sequence GQA grid (4 kv heads x 64 key tiles) to 2048 blocks.
TEST(CudaAttentionTc, DkvHeadSplitsDependOnTheShapeOnly) {
  EXPECT_EQ(launch::attention_tc_dkv_splits(4096, 1, 32, 4), 8);
  EXPECT_EQ(launch::attention_tc_dkv_splits(4096, 1, 32, 8), 4);   // 512 blocks x 4
  EXPECT_EQ(launch::attention_tc_dkv_splits(2048, 4, 16, 16), 1);  // no GQA: nothing to split
  EXPECT_EQ(launch::attention_tc_dkv_splits(200, 2, 12, 4), 1);    // a group of 3: powers of two only
  EXPECT_EQ(launch::attention_tc_dkv_splits(65536, 8, 32, 4), 1);  // enough blocks already
  EXPECT_EQ(launch::attention_tc_dkv_part_floats(4096, 1, 32, 4, 128), 2 * 8 * 4096 * 4 * 128);
  EXPECT_EQ(launch::attention_tc_dkv_part_floats(2048, 4, 16, 16, 128), 0);
}

TEST(CudaAttentionTc, MatchesTheWarpPerRowGpuKernel) {
  MOE_REQUIRE_GPU();
  for (const Case& c : kCases) {
    const Inputs in(c);
    const Outputs tc = run_launchers(c, in, true), rowwise = run_launchers(c, in, false);
    double e[5];
    const std::string msg = errors(tc, rowwise, e);
    EXPECT_TRUE(all_below(e, kTol)) << c.str() << ": relative errors vs the warp-per-row kernel " << msg
                                    << " (tolerance " << kTol << ")";
  }
}

TEST(CudaAttentionTc, Bf16EntryPointsTakeTheTensorCorePathWhereItApplies) {
  MOE_REQUIRE_GPU();
  const ScopedAttentionBackend native(AttentionBackend::kNative);
  // D 64/128 → tensor cores; D 32 → the warp-per-row kernel (bitwise equal to the launcher each names).
  for (const Case& c : {Case{70, 2, 2, 1, 64}, Case{70, 1, 2, 2, 128}, Case{70, 2, 2, 1, 32}}) {
    const bool tc = launch::attention_tc_supported(c.S, c.B, c.Nq, c.D, true);
    EXPECT_EQ(tc, c.D != 32) << c.str();
    const Inputs in(c);
    const Outputs via_entry = run_gpu(c, in), direct = run_launchers(c, in, tc);
    EXPECT_TRUE(bitwise_equal(via_entry.o, direct.o) && bitwise_equal(via_entry.lse, direct.lse) &&
                bitwise_equal(via_entry.dq, direct.dq) && bitwise_equal(via_entry.dk, direct.dk) &&
                bitwise_equal(via_entry.dv, direct.dv))
        << c.str() << ": the bf16 entry points did not run the " << (tc ? "tensor-core" : "warp-per-row") << " kernels";
  }
  EXPECT_FALSE(launch::attention_tc_supported(70, 1, 2, 64, false)) << "the f32 path stays on the warp-per-row kernel";
}
#endif

}  // namespace
}  // namespace moecore::kernels
