// Multi-latent attention and multi-token prediction trained on the GPU (docs/cuda.md): a tiny DeepSeek-V3-like model
// (MLA with q and kv LoRA, YaRN or plain RoPE, a dense first layer, sigmoid routing over groups with the expert bias,
// a shared expert, the sequence aux loss, one or two MTP depths) trained 10 steps on the GPU equals the CPU run: lm
// loss, gradient norm and each MTP depth's loss within 1e-5 relative in f32 (TF32 off), 1e-2 in bf16; a GPU rerun is
// bitwise identical. Without a GPU each test is skipped with a one-line reason.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "config_util.h"
#include "gpu_util.h"
#include "moecore/kernels/cuda/kernels.h"
#include "moecore/nn/mtp.h"
#include "moecore/train/trainer.h"

namespace moecore {
namespace {

using testing::operator+;

constexpr int kSteps = 10;

// H 64, 2 layers (dense then MoE: 4 experts top-2 in 2 groups of which 1 is kept), MLA with q LoRA 24, kv LoRA 16,
// head dims 8 + 8 (rope) and v 12 (so the kernel's head dim pads v), YaRN unless `extra` says otherwise.
std::vector<std::string> deepseek_args(const std::string& device, bool bf16, const std::vector<std::string>& extra) {
  std::vector<std::string> a =
      train::override_flags(testing::tiny_moe_flags(), {"--hidden-size", "64"}) +
      testing::mock_run_flags(32, 2, 4, 120, kSteps, "1e-3") +
      std::vector<std::string>{"--make-vocab-size-divisible-by", "64"} + testing::small_mla_flags(true) +
      testing::deepseek_routing_flags() +
      std::vector<std::string>{"--mtp-num-layers", "1",    "--mtp-loss-scaling-factor", "0.3",  "--clip-grad", "1.0",
                               "--log-interval",   "1000", "--eval-interval",           "1000", "--device",    device};
  if (bf16) a.push_back("--bf16");
  return train::override_flags(a, extra);
}

struct Steps {
  std::vector<double> loss, norm;
  std::vector<std::vector<double>> mtp;  // [step][depth]
};

Steps train_steps(const std::vector<std::string>& args) {
  std::FILE* null = std::fopen("/dev/null", "w");
  Steps r;
  {
    train::Trainer t(train::parse_train_config(args), null, false);
    for (int i = 0; i < kSteps; i++) {
      const train::StepResult s = t.train_step();
      r.loss.push_back(s.lm_loss);
      r.norm.push_back(s.grad_norm);
      r.mtp.push_back(s.mtp_losses);
    }
  }
  std::fclose(null);
  return r;
}

// |a − b| <= rel·|b|, printing the measured relative error on failure.
void expect_rel(double a, double b, double rel, const std::string& what) {
  const double err = std::fabs(a - b) / std::max(std::fabs(b), 1e-30);
  EXPECT_LE(err, rel) << what << ": " << a << " vs " << b << " (relative error " << err << ", allowed " << rel << ")";
}

void expect_close(const Steps& gpu, const Steps& cpu, double rel, size_t depths, const std::string& what) {
  ASSERT_EQ(gpu.loss.size(), cpu.loss.size());
  for (size_t i = 0; i < cpu.loss.size(); i++) {
    const std::string step = what + " step " + std::to_string(i + 1);
    expect_rel(gpu.loss[i], cpu.loss[i], rel, step + " lm loss");
    expect_rel(gpu.norm[i], cpu.norm[i], rel, step + " grad norm");
    ASSERT_EQ(cpu.mtp[i].size(), depths) << step;
    ASSERT_EQ(gpu.mtp[i].size(), depths) << step;
    for (size_t k = 0; k < depths; k++) {
      EXPECT_GT(cpu.mtp[i][k], 0.0) << step << " mtp depth " << k;
      expect_rel(gpu.mtp[i][k], cpu.mtp[i][k], rel, step + " mtp depth " + std::to_string(k) + " loss");
    }
  }
}

void expect_bitwise(const Steps& a, const Steps& b, const std::string& what) {
  ASSERT_EQ(a.loss.size(), b.loss.size());
  for (size_t i = 0; i < a.loss.size(); i++) {
    EXPECT_EQ(a.loss[i], b.loss[i]) << what << ": lm loss at step " << i + 1;
    EXPECT_EQ(a.norm[i], b.norm[i]) << what << ": grad norm at step " << i + 1;
    EXPECT_EQ(a.mtp[i], b.mtp[i]) << what << ": mtp losses at step " << i + 1;
  }
}

// The block moves alone: each of move_block's three forms (per head, broadcast, head sum) on the GPU equals the CPU
// loop bit for bit (the sum adds heads in ascending order), and leaves the other destination channels alone.
TEST(CudaMlaMtp, BlockMovesMatchTheCpuLoopBitwise) {
  MOE_REQUIRE_GPU();
  std::mt19937 gen(7);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  auto random = [&](int64_t n) {
    Tensor t = Tensor::empty({n}, DType::F32);
    for (int64_t i = 0; i < n; i++) t.data<float>()[i] = u(gen);
    return t;
  };
  struct Case {
    int64_t Ns, Ws, s0, Nd, Wd, d0, w;
  };
  const int64_t R = 37;
  for (const Case& c : {Case{4, 20, 3, 4, 24, 5, 12}, Case{1, 8, 0, 4, 16, 8, 8}, Case{4, 16, 8, 1, 8, 0, 8},
                        Case{1, 24, 16, 1, 40, 7, 8}}) {
    const Tensor src = random(R * c.Ns * c.Ws), dst0 = random(R * c.Nd * c.Wd);
    Tensor want = dst0.clone();
    const float* s = src.data<float>();
    float* d = want.data<float>();
    for (int64_t r = 0; r < R; r++)
      for (int64_t i = 0; i < c.w; i++) {
        float* out = d + r * c.Nd * c.Wd + c.d0 + i;
        if (c.Nd == 1 && c.Ns > 1) {
          *out = 0;
          for (int64_t n = 0; n < c.Ns; n++) *out += s[r * c.Ns * c.Ws + n * c.Ws + c.s0 + i];
        } else {
          for (int64_t n = 0; n < c.Nd; n++) out[n * c.Wd] = s[r * c.Ns * c.Ws + (c.Ns == 1 ? 0 : n * c.Ws) + c.s0 + i];
        }
      }
    Tensor dst = dst0.to(Device::cuda());
    kernels::mla_move_block(src.to(Device::cuda()), c.Ns, c.Ws, c.s0, dst, c.Nd, c.Wd, c.d0, c.w, R);
    const Tensor got = dst.to(Device::cpu());
    int64_t diff = 0;
    for (int64_t i = 0; i < want.numel(); i++) diff += got.data<float>()[i] != want.data<float>()[i];
    EXPECT_EQ(diff, 0) << "Ns " << c.Ns << " Nd " << c.Nd << ": " << diff << " of " << want.numel()
                       << " elements differ from the CPU loop";
  }
}

// MTP's roll on the GPU (labels and mask arrive there): the same rows as on the host, the last k rows zero.
TEST(CudaMlaMtp, RollSequenceOnTheGpuEqualsTheHost) {
  MOE_REQUIRE_GPU();
  const int64_t S = 9, B = 3;
  Tensor ids = Tensor::empty({S * B}, DType::I64);
  for (int64_t i = 0; i < S * B; i++) ids.data<int64_t>()[i] = 5 + i;
  for (int64_t k : {0, 1, 2, 9, 12}) {
    const Tensor want = nn::roll_sequence(ids, S, B, k);
    const Tensor got = nn::roll_sequence(ids.to(Device::cuda()), S, B, k).to(Device::cpu());
    ASSERT_TRUE(got.device().is_cpu());
    for (int64_t i = 0; i < S * B; i++)
      EXPECT_EQ(got.data<int64_t>()[i], want.data<int64_t>()[i]) << "k " << k << " element " << i;
  }
}

// The device under test: "cuda" (flip to "cpu" to check the flag sets without a GPU: CPU vs CPU must pass).
const char* const kGpu = "cuda";

TEST(CudaMlaMtp, DeepSeekLikeF32MatchesTheCpuAndRerunsBitwise) {
  MOE_REQUIRE_GPU();
  const Steps cpu = train_steps(deepseek_args("cpu", false, {}));
  const Steps gpu = train_steps(deepseek_args(kGpu, false, {}));
  expect_close(gpu, cpu, 1e-5, 1, "f32 MLA (YaRN) + MTP, GPU vs CPU");
  expect_bitwise(train_steps(deepseek_args(kGpu, false, {})), gpu, "f32 GPU rerun");
}

TEST(CudaMlaMtp, DeepSeekLikeBf16MatchesTheCpuWithinOnePercent) {
  MOE_REQUIRE_GPU();
  const Steps cpu = train_steps(deepseek_args("cpu", true, {}));
  const Steps gpu = train_steps(deepseek_args(kGpu, true, {}));
  expect_close(gpu, cpu, 1e-2, 1, "bf16 MLA (YaRN) + MTP, GPU vs CPU");
  expect_bitwise(train_steps(deepseek_args(kGpu, true, {})), gpu, "bf16 GPU rerun");
}

// Plain RoPE on part of the rope channels, no q LoRA (linear_q_proj), two MTP depths.
TEST(CudaMlaMtp, PlainRopeWithoutQLoraAndTwoMtpDepthsMatchesTheCpu) {
  MOE_REQUIRE_GPU();
  const std::vector<std::string> extra{"--rope-type", "rope", "--q-lora-rank", "0", "--mtp-num-layers", "2"};
  const Steps cpu = train_steps(deepseek_args("cpu", false, extra));
  const Steps gpu = train_steps(deepseek_args(kGpu, false, extra));
  expect_close(gpu, cpu, 1e-5, 2, "f32 MLA (RoPE, no q LoRA) + 2 MTP depths, GPU vs CPU");
}

// The recomputed parts of MLA (selective: its up projections and the core attention) on the GPU.
TEST(CudaMlaMtp, SelectiveMlaRecomputeMatchesTheCpu) {
  MOE_REQUIRE_GPU();
  const std::vector<std::string> extra{"--recompute-granularity", "selective", "--recompute-modules", "mla_up_proj",
                                       "core_attn"};
  const Steps cpu = train_steps(deepseek_args("cpu", false, extra));
  const Steps gpu = train_steps(deepseek_args(kGpu, false, extra));
  expect_close(gpu, cpu, 1e-5, 1, "f32 MLA recomputing mla_up_proj and core_attn, GPU vs CPU");
}

// Full uniform recompute: the layers and the MTP depth keep only their inputs and run again in backward.
TEST(CudaMlaMtp, FullRecomputeWithMtpMatchesTheCpu) {
  MOE_REQUIRE_GPU();
  const std::vector<std::string> extra{"--recompute-granularity", "full", "--recompute-method", "uniform",
                                       "--recompute-num-layers",  "1"};
  const Steps cpu = train_steps(deepseek_args("cpu", false, extra));
  const Steps gpu = train_steps(deepseek_args(kGpu, false, extra));
  expect_close(gpu, cpu, 1e-5, 1, "f32 full recompute with MLA + MTP, GPU vs CPU");
}

}  // namespace
}  // namespace moecore
