// The GPU profile of bench train (cuda/gpu_profile.h) on a GPU: kernel-level phases are timed on the compute
// stream, a copy to the host is counted at its call site, scopes on another stream are ignored, and a tiny MoE
// training step's phases add up to no more than the step with GEMM, attention, norms, router and optimizer time > 0.
// Without a GPU each test is skipped with a one-line reason.
#include <gtest/gtest.h>

// CUDA builds only (the launchers and streams need CUDA's headers).
#ifdef MOECORE_HAVE_CUDA
#include <cstdio>
#include <string>
#include <vector>

#include "cuda/gpu_util.h"
#include "cuda/kernel_compare.h"
#include "moecore/core/timer.h"
#include "moecore/device/gpu_profile.h"
#include "moecore/device/runtime.h"
#include "moecore/device/stream.h"
#include "moecore/kernels/gemm.h"
#include "moecore/train/config/start_config.h"
#include "moecore/train/trainer.h"

namespace moecore::device {
namespace {

using testing_cuda::gpu;
using testing_cuda::host_random;

double named_sum(const GpuProfileReport& r) {
  double s = 0;
  for (int p = 1; p < kPhaseCount; p++) s += r.phase_s[p];
  return s;
}

TEST(CudaProfile, GemmTimeAndACopyToTheHostAreSeen) {
  MOE_REQUIRE_GPU();
  const Tensor A = gpu(host_random({512, 512}, 1)), B = gpu(host_random({512, 512}, 2));
  Tensor C = Tensor::empty({512, 512}, DType::F32, Device::cuda());
  GpuProfiler prof(Device::cuda());
  for (int step = 0; step < 2; step++) {
    prof.begin_step();
    for (int i = 0; i < 4; i++) kernels::gemm(A, false, B, false, C, 1.0f, 0.0f);
    EXPECT_TRUE(std::isfinite(C.to(Device::cpu()).item(0)));  // one copy device->host
    prof.end_step();
  }
  const GpuProfileReport r = prof.report(4);
  EXPECT_EQ(r.steps, 2);
  EXPECT_GT(r.phase_s[static_cast<int>(Phase::kGemm)], 0.0);
  EXPECT_LE(named_sum(r), r.step_s * (1 + 1e-6) + 1e-6);
  EXPECT_DOUBLE_EQ(r.syncs_per_step, 1.0);
  ASSERT_EQ(r.top_sites.size(), 1u);
  EXPECT_EQ(r.top_sites[0].what, "copy device->host");
  EXPECT_DOUBLE_EQ(r.top_sites[0].bytes_per_call, 512.0 * 512.0 * 4.0);
  EXPECT_FALSE(r.top_sites[0].frames.empty());
  std::printf("sync site frames: ");
  for (const std::string& f : r.top_sites[0].frames) std::printf("%s ", f.c_str());
  std::printf("\n");
}

TEST(CudaProfile, ScopesOnAnotherStreamAreIgnored) {
  MOE_REQUIRE_GPU();
  const Tensor A = gpu(host_random({256, 256}, 3)), B = gpu(host_random({256, 256}, 4));
  Tensor C = Tensor::empty({256, 256}, DType::F32, Device::cuda());
  Stream side;
  GpuProfiler prof(Device::cuda());
  prof.begin_step();
  {
    const StreamGuard guard(side.get());
    kernels::gemm(A, false, B, false, C, 1.0f, 0.0f);
  }
  side.synchronize();  // counted: a host synchronisation inside the step
  prof.end_step();
  const GpuProfileReport r = prof.report(4);
  EXPECT_EQ(r.phase_s[static_cast<int>(Phase::kGemm)], 0.0);
  EXPECT_DOUBLE_EQ(r.syncs_per_step, 1.0);
}

std::vector<std::string> tiny_moe(const std::string& bf16) {
  std::vector<std::string> a = {"--mock-data",
                                "--vocab-size",
                                "256",
                                "--num-layers",
                                "2",
                                "--hidden-size",
                                "128",
                                "--num-attention-heads",
                                "4",
                                "--group-query-attention",
                                "--num-query-groups",
                                "2",
                                "--kv-channels",
                                "64",
                                "--qk-layernorm",
                                "--seq-length",
                                "128",
                                "--max-position-embeddings",
                                "128",
                                "--micro-batch-size",
                                "2",
                                "--global-batch-size",
                                "4",
                                "--train-iters",
                                "10",
                                "--lr",
                                "1e-3",
                                "--position-embedding-type",
                                "rope",
                                "--normalization",
                                "RMSNorm",
                                "--swiglu",
                                "--hidden-dropout",
                                "0",
                                "--attention-dropout",
                                "0",
                                "--disable-bias-linear",
                                "--num-experts",
                                "8",
                                "--moe-router-topk",
                                "2",
                                "--moe-ffn-hidden-size",
                                "128",
                                "--moe-aux-loss-coeff",
                                "1e-2",
                                "--log-interval",
                                "1000",
                                "--eval-iters",
                                "0",
                                "--timing-log-level",
                                "2",
                                "--device",
                                "cuda"};
  if (!bf16.empty()) a.push_back(bf16);
  return a;
}

TEST(CudaProfile, ATrainingStepsPhasesAddUpToNoMoreThanTheStep) {
  MOE_REQUIRE_GPU();
  std::FILE* null = std::fopen("/dev/null", "w");
  {
    train::Trainer t(train::parse_train_config(tiny_moe("--bf16")), null, false);
    GpuProfiler prof(t.device());
    prof.begin_step();
    t.train_step();  // warm-up
    prof.end_step();
    prof.reset();
    double host_s = 0;
    for (int i = 0; i < 2; i++) {
      synchronize();
      const Stopwatch w;
      prof.begin_step();
      t.train_step();
      prof.end_step();
      host_s += w.seconds() / 2;
    }
    const GpuProfileReport r = prof.report(5);
    EXPECT_EQ(r.steps, 2);
    EXPECT_LE(named_sum(r), r.step_s * (1 + 1e-6) + 1e-6);
    EXPECT_LE(r.step_s, host_s + 1e-3);  // the events lie inside the host's span of the step
    for (Phase p : {Phase::kGemm, Phase::kAttention, Phase::kNorm, Phase::kRouter, Phase::kPermute, Phase::kOptimizer})
      EXPECT_GT(r.phase_s[static_cast<int>(p)], 0.0) << phase_label(p);
    EXPECT_GT(r.syncs_per_step, 0.0);  // at least the per-expert token counts
    EXPECT_FALSE(r.top_sites.empty());
    std::printf("tiny MoE step: %.4f s (host %.4f s), %.1f syncs/step\n", r.step_s, host_s, r.syncs_per_step);
    for (int p = 0; p < kPhaseCount; p++)
      std::printf("  %-46s %.5f s\n", phase_label(static_cast<Phase>(p)), r.phase_s[p]);
    for (const auto& s : r.top_sites)
      std::printf("  %5.1f/step %s in %s\n", s.per_step, s.what.c_str(), phase_key(s.phase));
  }
  std::fclose(null);
}

}  // namespace
}  // namespace moecore::device

#endif  // MOECORE_HAVE_CUDA
