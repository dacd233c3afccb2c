// Training through the modules on the GPU (docs/cuda.md): a dense GPT's 20 steps equal the CPU run's (f32 with TF32
// off: losses and gradient norms within 1e-5; bf16: 1e-2), a rerun is bitwise identical, and a checkpoint saved on
// the GPU resumes bitwise. With Megatron's dropout (0.1 hidden and attention) the GPU draws the CPU's masks, so the
// runs still agree to 1e-5. Without a GPU each test is skipped with a one-line reason.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "ckpt/hf_test_util.h"
#include "config_util.h"
#include "gpu_util.h"
#include "moecore/train/config/device_support.h"
#include "moecore/train/config/start_config.h"
#include "moecore/train/trainer.h"
#include "test_util.h"

namespace moecore {
namespace {

namespace fs = std::filesystem;

std::vector<std::string> dense_args(const std::string& device, bool bf16, const std::string& dropout = "0") {
  std::vector<std::string> a{"--mock-data",
                             "--vocab-size",
                             "128",
                             "--num-layers",
                             "2",
                             "--hidden-size",
                             "64",
                             "--ffn-hidden-size",
                             "128",
                             "--num-attention-heads",
                             "4",
                             "--group-query-attention",
                             "--num-query-groups",
                             "2",
                             "--seq-length",
                             "64",
                             "--max-position-embeddings",
                             "64",
                             "--micro-batch-size",
                             "2",
                             "--global-batch-size",
                             "4",
                             "--train-iters",
                             "20",
                             "--lr",
                             "1e-3",
                             "--position-embedding-type",
                             "rope",
                             "--normalization",
                             "RMSNorm",
                             "--swiglu",
                             "--hidden-dropout",
                             dropout,
                             "--attention-dropout",
                             dropout,
                             "--disable-bias-linear",
                             "--untie-embeddings-and-output-weights",
                             "--clip-grad",
                             "1.0",
                             "--log-interval",
                             "1000",
                             "--eval-interval",
                             "1000",
                             "--eval-iters",
                             "1",
                             "--device",
                             device};
  if (bf16) a.push_back("--bf16");
  return a;
}

struct Losses {
  std::vector<double> loss, norm;
};

Losses train_steps(const std::vector<std::string>& args, int steps) {
  std::FILE* null = std::fopen("/dev/null", "w");
  Losses r;
  {
    train::Trainer t(train::parse_train_config(args), null, false);
    for (int i = 0; i < steps; i++) {
      const auto s = t.train_step();
      r.loss.push_back(s.lm_loss);
      r.norm.push_back(s.grad_norm);
    }
  }
  std::fclose(null);
  return r;
}

void expect_close(const Losses& gpu, const Losses& cpu, double rel, const std::string& what) {
  ASSERT_EQ(gpu.loss.size(), cpu.loss.size());
  for (size_t i = 0; i < cpu.loss.size(); i++) {
    EXPECT_NEAR(gpu.loss[i], cpu.loss[i], rel * std::fabs(cpu.loss[i])) << what << ": loss at step " << i + 1;
    EXPECT_NEAR(gpu.norm[i], cpu.norm[i], rel * std::fabs(cpu.norm[i])) << what << ": grad norm at step " << i + 1;
  }
}

void expect_bitwise(const Losses& a, const Losses& b, const std::string& what) {
  for (size_t i = 0; i < a.loss.size(); i++) {
    EXPECT_EQ(a.loss[i], b.loss[i]) << what << ": loss at step " << i + 1;
    EXPECT_EQ(a.norm[i], b.norm[i]) << what << ": grad norm at step " << i + 1;
  }
}

TEST(CudaTrain, DenseGptF32MatchesTheCpuAndRerunsBitwise) {
  MOE_REQUIRE_GPU();
  const Losses cpu = train_steps(dense_args("cpu", false), 20);
  const Losses gpu = train_steps(dense_args("cuda", false), 20);
  expect_close(gpu, cpu, 1e-5, "f32 GPU vs CPU");
  expect_bitwise(train_steps(dense_args("cuda", false), 20), gpu, "GPU rerun");
}

// Issue 43 item 1: hidden and attention dropout 0.1 train on the GPU with the CPU's masks: 10 steps within 1e-5 in
// f32, bitwise on a rerun, and visibly different from the run without dropout.
TEST(CudaTrain, DenseGptWithDropoutF32MatchesTheCpuAndRerunsBitwise) {
  MOE_REQUIRE_GPU();
  const Losses cpu = train_steps(dense_args("cpu", false, "0.1"), 10);
  const Losses gpu = train_steps(dense_args("cuda", false, "0.1"), 10);
  expect_close(gpu, cpu, 1e-5, "f32 GPU vs CPU with dropout 0.1");
  expect_bitwise(train_steps(dense_args("cuda", false, "0.1"), 10), gpu, "GPU rerun with dropout");
  const Losses plain = train_steps(dense_args("cuda", false), 10);
  EXPECT_NE(plain.loss.back(), gpu.loss.back()) << "dropout changed nothing";
}

TEST(CudaTrain, DenseGptWithDropoutBf16MatchesTheCpuWithinOnePercent) {
  MOE_REQUIRE_GPU();
  expect_close(train_steps(dense_args("cuda", true, "0.1"), 10), train_steps(dense_args("cpu", true, "0.1"), 10), 1e-2,
               "bf16 GPU vs CPU with dropout 0.1");
}

TEST(CudaTrain, DenseGptBf16MatchesTheCpuWithinOnePercent) {
  MOE_REQUIRE_GPU();
  const Losses cpu = train_steps(dense_args("cpu", true), 20);
  const Losses gpu = train_steps(dense_args("cuda", true), 20);
  expect_close(gpu, cpu, 1e-2, "bf16 GPU vs CPU");
  expect_bitwise(train_steps(dense_args("cuda", true), 20), gpu, "bf16 GPU rerun");
}

// Issue 22 item 5: the tiny MoE model (4 experts top-2, aux and z losses) trains on the GPU with the CPU's losses.
std::vector<std::string> tiny_moe_args(const std::string& device, bool bf16) {
  using testing::operator+;
  std::vector<std::string> a =
      testing::tiny_moe_flags() + testing::mock_run_flags(32, 2, 8, 128, 20, "1e-3") +
      std::vector<std::string>{"--moe-aux-loss-coeff", "1e-2", "--moe-z-loss-coeff", "1e-3", "--device", device};
  if (bf16) a.push_back("--bf16");
  return a;
}

TEST(CudaTrain, TinyMoeF32MatchesTheCpuOver20StepsAndRerunsBitwise) {
  MOE_REQUIRE_GPU();
  const Losses cpu = train_steps(tiny_moe_args("cpu", false), 20);
  const Losses gpu = train_steps(tiny_moe_args("cuda", false), 20);
  expect_close(gpu, cpu, 1e-5, "tiny-moe f32 GPU vs CPU");
  expect_bitwise(train_steps(tiny_moe_args("cuda", false), 20), gpu, "tiny-moe GPU rerun");
}

TEST(CudaTrain, TinyMoeWithDropoutF32MatchesTheCpuAndRerunsBitwise) {
  MOE_REQUIRE_GPU();
  auto args = [](const std::string& device) {
    std::vector<std::string> a = tiny_moe_args(device, false);
    a.insert(a.end(), {"--hidden-dropout", "0.1", "--attention-dropout", "0.1"});
    return a;
  };
  const Losses gpu = train_steps(args("cuda"), 10);
  expect_close(gpu, train_steps(args("cpu"), 10), 1e-5, "tiny-moe f32 GPU vs CPU with dropout 0.1");
  expect_bitwise(train_steps(args("cuda"), 10), gpu, "tiny-moe GPU rerun with dropout");
}

TEST(CudaTrain, TinyMoeBf16MatchesTheCpuWithinOnePercent) {
  MOE_REQUIRE_GPU();
  expect_close(train_steps(tiny_moe_args("cuda", true), 20), train_steps(tiny_moe_args("cpu", true), 20), 1e-2,
               "tiny-moe bf16 GPU vs CPU");
}

// An HF Qwen3-MoE checkpoint imported with --load-hf evaluates on the GPU to the CPU's loss (f32).
TEST(CudaTrain, ImportedQwen3MoeEvaluatesToTheCpuLoss) {
  MOE_REQUIRE_GPU();
  const std::string hf = testing::fresh_temp_path("cuda_hf_qwen3");
  testing::write_hf(hf, testing::qwen3_config());
  std::FILE* null = std::fopen("/dev/null", "w");
  double loss[2] = {0, 0};
  for (int i = 0; i < 2; i++) {
    train::Trainer t(
        testing::hf_run_config({"--load-hf", hf, "--eval-iters", "2", "--device", i == 0 ? "cpu" : "cuda"}), null,
        false);
    ASSERT_EQ(t.device().is_cuda(), i == 1);
    loss[i] = t.evaluate(2);
  }
  std::fclose(null);
  EXPECT_NEAR(loss[1], loss[0], 1e-5 * std::fabs(loss[0])) << "eval loss on the GPU vs the CPU";
  fs::remove_all(hf);
}

// Megatron's defaults: LayerNorm, learned absolute positions, GeLU, linear biases, a tied output layer.
TEST(CudaTrain, MegatronDefaultGptMatchesTheCpu) {
  MOE_REQUIRE_GPU();
  auto args = [](const std::string& device) {
    return std::vector<std::string>{"--mock-data", "--vocab-size",       "128",  "--num-layers",
                                    "2",           "--hidden-size",      "64",   "--num-attention-heads",
                                    "4",           "--seq-length",       "64",   "--max-position-embeddings",
                                    "64",          "--micro-batch-size", "2",    "--global-batch-size",
                                    "4",           "--train-iters",      "10",   "--lr",
                                    "1e-3",        "--hidden-dropout",   "0",    "--attention-dropout",
                                    "0",           "--log-interval",     "1000", "--eval-interval",
                                    "1000",        "--eval-iters",       "1",    "--device",
                                    device};
  };
  expect_close(train_steps(args("cuda"), 10), train_steps(args("cpu"), 10), 1e-5, "Megatron-default GPT");
}

TEST(CudaTrain, ACheckpointSavedOnTheGpuResumesBitwise) {
  MOE_REQUIRE_GPU();
  const std::string dir = testing::fresh_temp_path("cuda_train_ckpt");
  const Losses whole = train_steps(dense_args("cuda", false), 8);
  std::vector<std::string> first = dense_args("cuda", false);
  first.insert(first.end(), {"--save", dir});
  {
    std::FILE* null = std::fopen("/dev/null", "w");
    train::Trainer t(train::parse_train_config(first), null, false);
    for (int i = 0; i < 4; i++) t.train_step();
    t.save_checkpoint();
    std::fclose(null);
  }
  std::vector<std::string> resume = dense_args("cuda", false);
  resume.insert(resume.end(), {"--load", dir});
  const Losses rest = train_steps(resume, 4);
  for (size_t i = 0; i < 4; i++) {
    EXPECT_EQ(rest.loss[i], whole.loss[4 + i]) << "resumed step " << 5 + i;
    EXPECT_EQ(rest.norm[i], whole.norm[4 + i]) << "resumed step " << 5 + i;
  }
  fs::remove_all(dir);
}

// With this process's GPU visible, auto trains on it, and what the GPU does not cover is refused under auto as under
// cuda, instead of a run on the CPU.
TEST(CudaTrain, UnsupportedSettingsAreRefusedOnTheGpuAndAutoDoesNotFallBack) {
  MOE_REQUIRE_GPU();
  // FP8's recipes are emulated on the CPU alone (train/config/device_support.cpp).
  train::TrainConfig g = train::parse_train_config(dense_args("cuda", false));
  g.fp8_format = "e4m3";
  const std::string e = testing::error_of([&] { train::training_device(g); });
  EXPECT_TRUE(testing::contains(e, "--fp8-format")) << e;
  train::TrainConfig c = train::parse_train_config(dense_args("auto", false));
  EXPECT_TRUE(train::training_device(c).is_cuda());
  c.fp8_format = "e4m3";
  const std::string ea = testing::error_of([&] { train::training_device(c); });
  EXPECT_TRUE(testing::contains(ea, "--device auto")) << ea;
  EXPECT_TRUE(testing::contains(ea, "does not fall back to the CPU")) << ea;
}

}  // namespace
}  // namespace moecore
