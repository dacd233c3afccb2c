// The rest of what the CPU trains, on the GPU (train/config/device_support.h covers it): SGD, Muon and dist_muon,
// Adam with bf16 moments, --log-num-zeros-in-grad, Sinkhorn routing and a top-k above the permutation's register
// sort, each over 10 steps of a tiny MoE GPT against the same run on the CPU (f32 with TF32 off: losses and gradient
// norms within 1e-5, the zero counts equal) and rerun bitwise on the GPU. Without a GPU each test is skipped.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "config_util.h"
#include "gpu_util.h"
#include "moecore/train/config/start_config.h"
#include "moecore/train/trainer.h"
#include "test_util.h"

namespace moecore {
namespace {

using testing::operator+;

// A tiny MoE GPT (4 experts, top-2, RMSNorm, RoPE, SwiGLU) on `device`, with `extra` flags.
std::vector<std::string> optim_run_args(const std::string& device, const std::vector<std::string>& extra) {
  return testing::tiny_moe_flags() + testing::mock_run_flags(32, 2, 4, 64, 10, "1e-2") +
         std::vector<std::string>{"--hidden-dropout", "0",    "--attention-dropout", "0",    "--clip-grad",  "1.0",
                                  "--log-interval",   "1000", "--eval-interval",     "1000", "--eval-iters", "1",
                                  "--device",         device} +
         extra;
}

struct OptimRun {
  std::vector<double> loss, norm;
  std::vector<int64_t> zeros;
};

OptimRun optim_run_steps(const std::vector<std::string>& args, int steps) {
  std::FILE* null = std::fopen("/dev/null", "w");
  OptimRun r;
  {
    train::Trainer t(train::parse_train_config(args), null, false);
    for (int i = 0; i < steps; i++) {
      const auto s = t.train_step();
      r.loss.push_back(s.lm_loss);
      r.norm.push_back(s.grad_norm);
      r.zeros.push_back(s.num_zeros);
    }
  }
  std::fclose(null);
  return r;
}

// 10 steps on the GPU within 1e-5 of the CPU's (zero counts equal), and a GPU rerun bitwise.
void expect_gpu_matches_cpu(const std::vector<std::string>& extra, const std::string& what) {
  const OptimRun cpu = optim_run_steps(optim_run_args("cpu", extra), 10);
  const OptimRun gpu = optim_run_steps(optim_run_args("cuda", extra), 10);
  for (size_t i = 0; i < cpu.loss.size(); i++) {
    EXPECT_NEAR(gpu.loss[i], cpu.loss[i], 1e-5 * std::fabs(cpu.loss[i])) << what << ": loss at step " << i + 1;
    EXPECT_NEAR(gpu.norm[i], cpu.norm[i], 1e-5 * std::fabs(cpu.norm[i])) << what << ": grad norm at step " << i + 1;
    EXPECT_EQ(gpu.zeros[i], cpu.zeros[i]) << what << ": zeros in grad at step " << i + 1;
  }
  const OptimRun again = optim_run_steps(optim_run_args("cuda", extra), 10);
  for (size_t i = 0; i < gpu.loss.size(); i++) {
    EXPECT_EQ(again.loss[i], gpu.loss[i]) << what << ": GPU rerun loss at step " << i + 1;
    EXPECT_EQ(again.norm[i], gpu.norm[i]) << what << ": GPU rerun grad norm at step " << i + 1;
  }
}

TEST(CudaOptimizers, SgdMatchesTheCpuAndRerunsBitwise) {
  MOE_REQUIRE_GPU();
  expect_gpu_matches_cpu({"--optimizer", "sgd", "--sgd-momentum", "0.9", "--weight-decay", "0.01"}, "sgd");
}

TEST(CudaOptimizers, MuonMatchesTheCpuAndRerunsBitwise) {
  MOE_REQUIRE_GPU();
  expect_gpu_matches_cpu({"--optimizer", "muon"}, "muon");
  expect_gpu_matches_cpu({"--optimizer", "muon", "--muon-fp32-matmul-prec", "high", "--muon-nesterov"},
                         "muon f32 Newton-Schulz, Nesterov");
}

TEST(CudaOptimizers, DistMuonMatchesTheCpuAndRerunsBitwise) {
  MOE_REQUIRE_GPU();
  expect_gpu_matches_cpu({"--optimizer", "dist_muon"}, "dist_muon");
}

TEST(CudaOptimizers, AdamWithBf16MomentsMatchesTheCpuAndRerunsBitwise) {
  MOE_REQUIRE_GPU();
  expect_gpu_matches_cpu({"--use-precision-aware-optimizer", "--exp-avg-dtype", "bf16", "--exp-avg-sq-dtype", "bf16",
                          "--use-distributed-optimizer"},
                         "bf16 moments, distributed optimizer");
}

TEST(CudaOptimizers, NumZerosInGradEqualsTheCpuCount) {
  MOE_REQUIRE_GPU();
  expect_gpu_matches_cpu({"--log-num-zeros-in-grad"}, "num zeros in grad");
  expect_gpu_matches_cpu({"--log-num-zeros-in-grad", "--use-distributed-optimizer"},
                         "num zeros in grad, distributed optimizer");
}

TEST(CudaOptimizers, SinkhornRoutingMatchesTheCpuAndRerunsBitwise) {
  MOE_REQUIRE_GPU();
  expect_gpu_matches_cpu({"--moe-router-load-balancing-type", "sinkhorn", "--moe-aux-loss-coeff", "0"}, "sinkhorn");
  expect_gpu_matches_cpu(
      {"--moe-router-load-balancing-type", "sinkhorn", "--moe-aux-loss-coeff", "0", "--moe-router-topk", "1"},
      "sinkhorn top-1");
}

// 80 experts top-72: the GPU permutation sorts each token's rows in memory above its register bound of 64.
TEST(CudaOptimizers, TopKAbove64MatchesTheCpuAndRerunsBitwise) {
  MOE_REQUIRE_GPU();
  expect_gpu_matches_cpu({"--num-experts", "80", "--moe-router-topk", "72", "--moe-ffn-hidden-size", "8"}, "top-72");
}

}  // namespace
}  // namespace moecore
