// Dropout on the GPU draws the CPU's masks (kernels/dropout.h, kernels/dropout_philox.h): hidden dropout bitwise equal
// to the CPU kernel (shapes off the Philox block, sequence offsets, sample indices above 2³², in place, backward, the
// module HiddenDropout), and attention dropout inside the GPU attention kernels against the CPU's (f32 through the
// warp-per-row kernel within 1e-5; bf16 through the tensor-core kernels, D 64/128, and the warp-per-row one, D 32,
// within the bf16 tolerance of test_cuda_attention_tc.cpp), with reruns bitwise and the mask visibly applied.
// Skipped (one line) without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "cuda/gpu_util.h"
#include "cuda/kernel_compare.h"
#include "moecore/kernels/attention.h"
#include "moecore/kernels/dropout.h"
#include "moecore/nn/dropout_sites.h"

namespace moecore::kernels {
namespace {

using testing_cuda::bitwise_equal;
using testing_cuda::gpu;
using testing_cuda::host_random;
using testing_cuda::rel_diff;

struct HiddenCase {
  int64_t S, B, C, seq_offset;
  double p;
};

TEST(CudaDropout, HiddenMaskIsTheCpusBitwise) {
  MOE_REQUIRE_GPU();
  const std::vector<int64_t> samples = {3, (int64_t{5} << 32) | 9, 70001};
  for (const HiddenCase& c : {HiddenCase{5, 2, 70, 0, 0.1}, HiddenCase{3, 3, 129, 77, 0.5},
                              HiddenCase{64, 1, 4096, 4096, 0.1}, HiddenCase{7, 2, 1, 2, 0.9}}) {
    const std::string what = "S=" + std::to_string(c.S) + " B=" + std::to_string(c.B) + " C=" + std::to_string(c.C) +
                             " offset=" + std::to_string(c.seq_offset);
    const std::vector<int64_t> sample_B(samples.begin(), samples.begin() + c.B);
    const DropoutMask m = DropoutMask::make(1234, 0xABC, c.p);
    const Tensor x = host_random({c.S, c.B, c.C}, 1);
    Tensor y = Tensor::empty(x.shape(), DType::F32);
    dropout_forward(x, m, sample_B, c.seq_offset, y);
    const Tensor gx = gpu(x);
    Tensor gy = Tensor::empty(x.shape(), DType::F32, Device::cuda());
    dropout_forward(gx, m, sample_B, c.seq_offset, gy);
    EXPECT_TRUE(bitwise_equal(gy, y)) << what << ": forward";
    Tensor inplace = gpu(x);
    dropout_forward(inplace, m, sample_B, c.seq_offset, inplace);
    EXPECT_TRUE(bitwise_equal(inplace, y)) << what << ": in place";
    Tensor dx = Tensor::empty(x.shape(), DType::F32), gdx = Tensor::empty(x.shape(), DType::F32, Device::cuda());
    dropout_backward(x, m, sample_B, c.seq_offset, dx);
    dropout_backward(gx, m, sample_B, c.seq_offset, gdx);
    EXPECT_TRUE(bitwise_equal(gdx, dx)) << what << ": backward";
    EXPECT_GT(rel_diff(gy, x), 0.5) << what << ": the mask dropped nothing";
  }
  // p = 0: the tensor passes unchanged.
  const Tensor x = gpu(host_random({4, 2, 8}, 2));
  Tensor y = Tensor::empty(x.shape(), DType::F32, Device::cuda());
  dropout_forward(x, DropoutMask::make(1, 2, 0.0), {0, 1}, 0, y);
  EXPECT_TRUE(bitwise_equal(y, x));
}

// The module on GPU tensors: Megatron's bias-dropout-add sites, forward in place and backward, as on the CPU.
TEST(CudaDropout, HiddenDropoutModuleRunsOnGpuTensors) {
  MOE_REQUIRE_GPU();
  const nn::HiddenDropout site("decoder.layers.0.mlp_bda.hidden_dropout", 0.1, nn::TPContext{});
  nn::DropoutBatch d;
  d.training = true;
  d.seed = 42;
  d.sample_B = {11, 12};
  const Tensor x = host_random({16, 2, 64}, 3);
  Tensor y = x.clone(), gy = gpu(x);
  site.forward_(y, d);
  site.forward_(gy, d);
  EXPECT_TRUE(bitwise_equal(gy, y));
  const Tensor dx = site.backward(x, d), gdx = site.backward(gpu(x), d);
  EXPECT_TRUE(gdx.device().is_cuda());
  EXPECT_TRUE(bitwise_equal(gdx, dx));
}

struct DropoutAttnCase {
  int64_t S, B, Nq, Nkv, D;
  int64_t seq_offset, key_offset;
  std::string str() const {
    return "S=" + std::to_string(S) + " B=" + std::to_string(B) + " Nq=" + std::to_string(Nq) +
           " Nkv=" + std::to_string(Nkv) + " D=" + std::to_string(D) + " offsets " + std::to_string(seq_offset) + "/" +
           std::to_string(key_offset);
  }
};

struct AttnOut {
  Tensor o, lse, dq, dk, dv;
};

AttnOut run_attention(const DropoutAttnCase& c, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout,
                      const AttentionDropout* drop, bool bf16, Device dev) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.D));
  AttnOut r{Tensor::empty(q.shape(), DType::F32, dev), Tensor::empty({c.B, c.Nq, c.S}, DType::F32, dev),
            Tensor::empty(q.shape(), DType::F32, dev), Tensor::empty(k.shape(), DType::F32, dev),
            Tensor::empty(v.shape(), DType::F32, dev)};
  const Tensor dq = q.to(dev), dk = k.to(dev), dv = v.to(dev), dd = dout.to(dev);
  if (bf16) {
    attention_forward_bf16(dq, dk, dv, scale, r.o, r.lse, drop);
    attention_backward_bf16(dd, dq, dk, dv, r.o, r.lse, scale, r.dq, r.dk, r.dv, drop);
  } else {
    attention_forward(dq, dk, dv, scale, r.o, r.lse, drop);
    attention_backward(dd, dq, dk, dv, r.o, r.lse, scale, r.dq, r.dk, r.dv, drop);
  }
  return r;
}

// f32: the GPU's warp-per-row kernel against the CPU flash kernel, both dropping the same probabilities.
// bf16: D 64/128 through the tensor cores, D 32 through the warp-per-row kernel, against the CPU bf16 kernel.
void attention_dropout_matches_the_cpu(bool bf16) {
  const double tol = bf16 ? 2e-2 : 1e-5;
  const std::vector<int64_t> samples = {21, (int64_t{3} << 32) | 1};
  const std::vector<DropoutAttnCase> cases =
      bf16 ? std::vector<DropoutAttnCase>{{130, 2, 4, 2, 64, 0, -1},
                                          {200, 1, 8, 1, 128, 0, -1},
                                          {70, 2, 2, 1, 64, 13, 130},
                                          {70, 2, 2, 1, 32, 0, -1}}
           : std::vector<DropoutAttnCase>{{70, 2, 4, 2, 32, 0, -1}, {130, 1, 2, 2, 64, 5, 3}};
  for (const DropoutAttnCase& c : cases) {
    AttentionDropout drop;
    drop.mask = DropoutMask::make(7, 0x5151, 0.1);
    drop.sample_B = samples.data();
    drop.head_offset = 2;
    drop.seq_offset = c.seq_offset;
    drop.key_offset = c.key_offset;
    const Tensor q = host_random({c.S, c.B, c.Nq, c.D}, 1), k = host_random({c.S, c.B, c.Nkv, c.D}, 2);
    const Tensor v = host_random(k.shape(), 3), dout = host_random(q.shape(), 4);
    const AttnOut cpu = run_attention(c, q, k, v, dout, &drop, bf16, Device::cpu());
    const AttnOut g = run_attention(c, q, k, v, dout, &drop, bf16, Device::cuda());
    const std::string what = c.str() + (bf16 ? " bf16" : " f32");
    EXPECT_LT(rel_diff(g.o, cpu.o), tol) << what << ": o";
    EXPECT_LT(rel_diff(g.lse, cpu.lse), tol) << what << ": lse";
    EXPECT_LT(rel_diff(g.dq, cpu.dq), tol) << what << ": dq";
    EXPECT_LT(rel_diff(g.dk, cpu.dk), tol) << what << ": dk";
    EXPECT_LT(rel_diff(g.dv, cpu.dv), tol) << what << ": dv";
    const AttnOut again = run_attention(c, q, k, v, dout, &drop, bf16, Device::cuda());
    EXPECT_TRUE(bitwise_equal(again.o, g.o) && bitwise_equal(again.dq, g.dq) && bitwise_equal(again.dk, g.dk) &&
                bitwise_equal(again.dv, g.dv))
        << what << ": rerun";
    // The undropped run on the kernels that ran the dropped one (bf16 without dropout would take cuDNN's path).
    const testing_cuda::ScopedAttentionBackend native(AttentionBackend::kNative);
    const AttnOut plain = run_attention(c, q, k, v, dout, nullptr, bf16, Device::cuda());
    EXPECT_GT(rel_diff(g.o, plain.o), 5e-2) << what << ": dropout changed nothing";
    EXPECT_TRUE(bitwise_equal(plain.lse, g.lse)) << what << ": lse is the undropped softmax's";
  }
}

TEST(CudaDropout, AttentionF32MatchesTheCpu) {
  MOE_REQUIRE_GPU();
  attention_dropout_matches_the_cpu(false);
}

TEST(CudaDropout, AttentionBf16MatchesTheCpu) {
  MOE_REQUIRE_GPU();
  attention_dropout_matches_the_cpu(true);
}

}  // namespace
}  // namespace moecore::kernels
