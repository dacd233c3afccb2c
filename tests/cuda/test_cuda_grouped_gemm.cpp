// The grouped experts on the GPU (one cuBLASLt matmul per expert over streams) against the CPU GroupedExperts:
// forward output, input and probability gradients, and both weight gradients (and, with Megatron's expert biases,
// both bias gradients), f32 (TF32 off) within 1e-5 and bf16 within 1e-2 relative to the reference's largest
// magnitude; row counts with empty experts and counts that are not multiples of the 32-row alignment; bitwise reruns;
// and the kernel's bf16 outputs against the CPU kernel's.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "cuda/gpu_util.h"
#include "cuda/kernel_compare.h"
#include "moecore/kernels/cuda/kernels.h"
#include "moecore/moe/grouped_experts.h"

namespace moecore {
namespace {

using testing_cuda::bitwise_equal;
using testing_cuda::gpu;
using testing_cuda::host_random;
using testing_cuda::rel_diff;

struct Outputs {
  Tensor y, dx, dprobs, dw1, dw2, db1, db2;  // db1, db2 with biases
};

// One forward and backward of E experts with the given row counts, on `d`, weights from seed 5.
Outputs run_experts(Device d, bool bf16, const std::vector<int64_t>& counts, int64_t H, int64_t F,
                    kernels::Activation act, bool bias = false) {
  const int64_t E = static_cast<int64_t>(counts.size());
  int64_t R = 0;
  for (int64_t c : counts) R += c;
  nn::ParamRegistry reg(DType::F32);
  moe::ExpertsConfig cfg{H, F, E, 0, act, 0.3, 0.3, bf16 ? LowPrecision(DType::BF16) : std::nullopt};
  cfg.bias = bias;
  moe::GroupedExperts ex(reg, "experts", cfg);
  reg.initialize(5);
  reg.zero_grad();
  // A non-zero starting gradient: the weight-gradient GEMMs accumulate (beta = 1).
  ex.fc1().grad.copy_from(host_random(ex.fc1().grad.shape(), 9, 0.1));
  ex.fc2().grad.copy_from(host_random(ex.fc2().grad.shape(), 10, 0.1));
  if (bias) {  // non-zero biases (they start at zero) and gradients
    ex.fc1_bias()->value.copy_from(host_random(ex.fc1_bias()->value.shape(), 14, 0.5));
    ex.fc2_bias()->value.copy_from(host_random(ex.fc2_bias()->value.shape(), 15, 0.5));
    ex.fc1_bias()->grad.copy_from(host_random(ex.fc1_bias()->grad.shape(), 16, 0.1));
    ex.fc2_bias()->grad.copy_from(host_random(ex.fc2_bias()->grad.shape(), 17, 0.1));
  }
  reg.to(d);
  const Tensor x = host_random({R, H}, 11).to(d), probs = host_random({R}, 12).to(d),
               dy = host_random({R, H}, 13).to(d);
  moe::GroupedExperts::Stash st;
  Outputs o;
  o.y = ex.forward(x, probs, counts, st).to(Device::cpu());
  o.dx = ex.backward(dy, st, o.dprobs).to(Device::cpu());
  o.dprobs = o.dprobs.to(Device::cpu());
  o.dw1 = ex.fc1().grad.to(Device::cpu());
  o.dw2 = ex.fc2().grad.to(Device::cpu());
  if (bias) {
    o.db1 = ex.fc1_bias()->grad.to(Device::cpu());
    o.db2 = ex.fc2_bias()->grad.to(Device::cpu());
  }
  return o;
}

void expect_close(const Outputs& got, const Outputs& want, double tol) {
  const std::pair<const char*, std::pair<const Tensor*, const Tensor*>> pairs[] = {
      {"y", {&got.y, &want.y}},       {"dx", {&got.dx, &want.dx}},    {"dprobs", {&got.dprobs, &want.dprobs}},
      {"dW1", {&got.dw1, &want.dw1}}, {"dW2", {&got.dw2, &want.dw2}}, {"db1", {&got.db1, &want.db1}},
      {"db2", {&got.db2, &want.db2}}};
  for (const auto& [name, t] : pairs) {
    ASSERT_EQ(t.first->defined(), t.second->defined()) << name;
    if (!t.first->defined()) continue;
    const double r = rel_diff(*t.first, *t.second);
    EXPECT_LE(r, tol) << name << ": relative difference " << r << " to the CPU experts (tolerance " << tol << ")";
  }
}

const std::vector<int64_t> kCounts = {5, 0, 37, 64, 1, 0, 90, 32};  // empty experts, unaligned and aligned counts

TEST(CudaGroupedGemm, ExpertsMatchTheCpuF32) {
  MOE_REQUIRE_GPU();
#ifdef MOECORE_HAVE_CUDA  // a CUDA build's own switch (a CPU-only build compiles these tests and skips them)
  kernels::cuda::set_allow_tf32(false);
#endif
  for (auto act : {kernels::Activation::SwiGLU, kernels::Activation::GeLU}) {
    SCOPED_TRACE(act == kernels::Activation::SwiGLU ? "SwiGLU" : "GeLU");
    const Outputs want = run_experts(Device::cpu(), false, kCounts, 48, 40, act);
    expect_close(run_experts(Device::cuda(), false, kCounts, 48, 40, act), want, 1e-5);
  }
}

TEST(CudaGroupedGemm, ExpertsMatchTheCpuBf16) {
  MOE_REQUIRE_GPU();
  const Outputs want = run_experts(Device::cpu(), true, kCounts, 64, 32, kernels::Activation::SwiGLU);
  expect_close(run_experts(Device::cuda(), true, kCounts, 64, 32, kernels::Activation::SwiGLU), want, 1e-2);
}

// Megatron's expert biases: fc1's added to h, fc2's scaled by the probability; f32 and bf16.
TEST(CudaGroupedGemm, ExpertsWithBiasesMatchTheCpu) {
  MOE_REQUIRE_GPU();
#ifdef MOECORE_HAVE_CUDA  // a CUDA build's own switch (a CPU-only build compiles these tests and skips them)
  kernels::cuda::set_allow_tf32(false);
#endif
  for (bool bf16 : {false, true})
    for (auto act : {kernels::Activation::SwiGLU, kernels::Activation::GeLU}) {
      SCOPED_TRACE(std::string(act == kernels::Activation::SwiGLU ? "SwiGLU" : "GeLU") + (bf16 ? ", bf16" : ", f32"));
      const Outputs want = run_experts(Device::cpu(), bf16, kCounts, 64, 40, act, true);
      expect_close(run_experts(Device::cuda(), bf16, kCounts, 64, 40, act, true), want, bf16 ? 1e-2 : 1e-5);
    }
}

TEST(CudaGroupedGemm, AllExpertsEmptyAndAllAligned) {
  MOE_REQUIRE_GPU();
  for (const std::vector<int64_t>& counts : {std::vector<int64_t>{0, 0, 0}, std::vector<int64_t>{32, 64, 0, 96}}) {
    const Outputs want = run_experts(Device::cpu(), false, counts, 32, 24, kernels::Activation::SwiGLU);
    expect_close(run_experts(Device::cuda(), false, counts, 32, 24, kernels::Activation::SwiGLU), want, 1e-5);
  }
}

TEST(CudaGroupedGemm, RerunsAreBitwise) {
  MOE_REQUIRE_GPU();
  const std::vector<int64_t> counts = {300, 0, 17, 512, 129, 64, 3, 250};
  for (bool bf16 : {false, true}) {
    const bool bias = bf16;  // the biases' kernels once, with bf16 rows
    SCOPED_TRACE(bf16 ? "bf16, biases" : "f32");
    const Outputs a = run_experts(Device::cuda(), bf16, counts, 256, 192, kernels::Activation::SwiGLU, bias);
    const Outputs b = run_experts(Device::cuda(), bf16, counts, 256, 192, kernels::Activation::SwiGLU, bias);
    EXPECT_TRUE(bitwise_equal(gpu(a.y), gpu(b.y))) << "y differs on rerun";
    EXPECT_TRUE(bitwise_equal(gpu(a.dx), gpu(b.dx))) << "dx differs on rerun";
    EXPECT_TRUE(bitwise_equal(gpu(a.dprobs), gpu(b.dprobs))) << "dprobs differs on rerun";
    EXPECT_TRUE(bitwise_equal(gpu(a.dw1), gpu(b.dw1))) << "dW1 differs on rerun";
    EXPECT_TRUE(bitwise_equal(gpu(a.dw2), gpu(b.dw2))) << "dW2 differs on rerun";
    if (bias) {
      EXPECT_TRUE(bitwise_equal(gpu(a.db1), gpu(b.db1))) << "db1 differs on rerun";
      EXPECT_TRUE(bitwise_equal(gpu(a.db2), gpu(b.db2))) << "db2 differs on rerun";
    }
  }
}

// The kernel alone: bf16 operands with a bf16 output (the f32 accumulation rounded by the GEMM's epilogue) against
// the CPU kernel's bf16 output; rows outside every expert's block stay untouched.
TEST(CudaGroupedGemm, Bf16OutputsMatchTheCpuKernel) {
  MOE_REQUIRE_GPU();
  const std::vector<int64_t> rows = {40, 0, 7, 96}, begin = {0, 40, 41, 48};  // a gap row at 40
  const int64_t R = 144, K = 64, N = 80, E = 4;
  const Tensor a = host_random({R, K}, 51).to(DType::BF16), w = host_random({E, N, K}, 52, 0.2).to(DType::BF16);
  Tensor want = Tensor::zeros({R, N}, DType::BF16);
  kernels::grouped_gemm(a, w, true, want, begin, rows);
  Tensor got = Tensor::zeros({R, N}, DType::BF16, Device::cuda());
  kernels::grouped_gemm(a.to(Device::cuda()), w.to(Device::cuda()), true, got, begin, rows);
  const Tensor got32 = got.to(Device::cpu()).to(DType::F32), want32 = want.to(DType::F32);
  EXPECT_LE(rel_diff(gpu(got32), want32), 8e-3);
  double gap = 0;
  for (int64_t j = 0; j < N; j++) gap = std::max(gap, std::fabs(got32.item(40 * N + j)));
  EXPECT_EQ(gap, 0.0) << "the gap row was written";
}

}  // namespace
}  // namespace moecore
