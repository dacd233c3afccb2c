// A small language-model step chained from the kernels (embedding → RMSNorm → output GEMM → cross-entropy, and
// back through both to AdamW), for 20 steps on the GPU and on the CPU: the losses agree within 1e-5 (f32, TF32 off)
// and a second GPU run gives the same bits. The kernel-level stand-in for the dense GPT on the GPU until the
// modules allocate on their input's device (docs/cuda.md).
#include <gtest/gtest.h>

#include <vector>

#include "cuda/gpu_util.h"
#include "cuda/kernel_compare.h"
#include "moecore/kernels/adamw_update.h"
#include "moecore/kernels/cross_entropy.h"
#include "moecore/kernels/elementwise.h"
#include "moecore/kernels/embedding.h"
#include "moecore/kernels/gemm.h"
#include "moecore/kernels/rmsnorm.h"

namespace moecore::kernels {
namespace {

using testing_cuda::host_random;

struct StepResult {
  std::vector<double> losses;
  Tensor emb, out;  // final weights, on the CPU
};

StepResult train(Device d, int steps) {
  const int64_t V = 40, H = 32, T = 24;
  Tensor emb = host_random({V, H}, 1, 0.5).to(d), w = Tensor::zeros({H}, DType::F32, d),
         out = host_random({V, H}, 2, 0.2).to(d);
  fill_(w, 1.0);
  Tensor ids = Tensor::empty({T}, DType::I64), tgt = Tensor::empty({T}, DType::I64);
  for (int64_t t = 0; t < T; t++) ids.set_item(t, (t * 7) % V), tgt.set_item(t, (t * 7 + 3) % V);
  ids = ids.to(d), tgt = tgt.to(d);
  auto zeros_like = [&](const Tensor& x) { return Tensor::zeros(x.shape(), DType::F32, d); };
  Tensor m_emb = zeros_like(emb), v_emb = zeros_like(emb), m_out = zeros_like(out), v_out = zeros_like(out);
  Tensor m_w = zeros_like(w), v_w = zeros_like(w);
  AdamWParams hp;
  hp.lr = 1e-2, hp.weight_decay = 0.01;
  StepResult r;
  for (int step = 1; step <= steps; step++) {
    Tensor x = Tensor::empty({T, H}, DType::F32, d), y = Tensor::empty({T, H}, DType::F32, d);
    Tensor rstd = Tensor::empty({T}, DType::F32, d), logits = Tensor::empty({T, V}, DType::F32, d);
    embedding_forward(ids, emb, x);
    rmsnorm_forward(x, w, 1e-5, y, rstd);
    gemm(y, false, out, true, logits);
    Tensor loss = Tensor::empty({T}, DType::F32, d), lse = Tensor::empty({T}, DType::F32, d);
    cross_entropy_forward(logits, tgt, loss, lse);
    r.losses.push_back(sum(loss) / static_cast<double>(T));
    Tensor dloss = Tensor::empty({T}, DType::F32, d), dlogits = Tensor::empty({T, V}, DType::F32, d);
    fill_(dloss, 1.0 / static_cast<double>(T));
    cross_entropy_backward(dloss, logits, tgt, lse, dlogits);
    Tensor dout = zeros_like(out), dy = Tensor::empty({T, H}, DType::F32, d), dx = Tensor::empty({T, H}, DType::F32, d);
    gemm(dlogits, true, y, false, dout);
    gemm(dlogits, false, out, false, dy);
    Tensor dw = zeros_like(w), demb = zeros_like(emb);
    rmsnorm_backward(dy, x, w, rstd, dx, dw);
    embedding_backward(dx, ids, demb);
    adamw_step(emb, demb, m_emb, v_emb, hp, step);
    adamw_step(out, dout, m_out, v_out, hp, step);
    adamw_step(w, dw, m_w, v_w, hp, step);
  }
  r.emb = emb.to(Device::cpu()), r.out = out.to(Device::cpu());
  return r;
}

TEST(CudaStep, TwentyStepsMatchTheCpuAndRerunBitwise) {
  const StepResult cpu = train(Device::cpu(), 20);  // the reference runs everywhere, and must learn
  ASSERT_EQ(cpu.losses.size(), 20u);
  EXPECT_LT(cpu.losses.back(), 0.9 * cpu.losses.front());
  MOE_REQUIRE_GPU();
  const StepResult g1 = train(Device::cuda(), 20), g2 = train(Device::cuda(), 20);
  ASSERT_EQ(g1.losses.size(), cpu.losses.size());
  for (size_t i = 0; i < cpu.losses.size(); i++) {
    EXPECT_NEAR(g1.losses[i], cpu.losses[i], 1e-5 * std::max(1.0, std::fabs(cpu.losses[i]))) << "step " << i + 1;
    EXPECT_EQ(g1.losses[i], g2.losses[i]) << "step " << i + 1;
  }
  EXPECT_TRUE(testing_cuda::bitwise_equal(g1.emb, g2.emb) && testing_cuda::bitwise_equal(g1.out, g2.out));
}

}  // namespace
}  // namespace moecore::kernels
