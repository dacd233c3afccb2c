// The MoE layer on the GPU against the same layer on the CPU: two registries initialized from
// one seed, one moved to the GPU; forward output, input gradient and every parameter gradient agree (f32: 1e-5
// relative to the largest magnitude; bf16 GEMMs: 1e-2), aux and z losses too, and a GPU rerun is bitwise identical.
// The shared-expert gate's kernels are checked through SharedExperts the same way.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "gpu_util.h"
#include "kernel_compare.h"
#include "moecore/moe/moe_layer.h"
#include "moecore/moe/shared_experts.h"

namespace moecore {
namespace {

using testing_cuda::bitwise_equal;
using testing_cuda::gpu;
using testing_cuda::host_random;
using testing_cuda::rel_diff;

moe::MoELayerConfig layer_config(bool bf16, bool shared_gate, bool sigmoid_groups) {
  moe::MoELayerConfig c;
  c.router.hidden = 64;
  c.router.num_experts = 8;
  c.router.topk = 2;
  c.ffn_hidden = 48;
  c.low = bf16 ? LowPrecision(DType::BF16) : std::nullopt;
  if (sigmoid_groups) {  // DeepSeek-V3's routing: sigmoid scores, expert bias, 4 groups of which 2 are kept
    c.router.score_function = moe::ScoreFunction::Sigmoid;
    c.router.num_groups = 4;
    c.router.group_topk = 2;
    c.router.enable_expert_bias = true;
    c.router.topk_scaling_factor = 2.5;
  }
  if (shared_gate) {
    c.shared_ffn_hidden = 32;
    c.shared_expert_gate = true;
  }
  return c;
}

struct LayerRun {
  Tensor y, dx;
  std::vector<Tensor> grads;
  double aux = 0;
};

LayerRun run_layer(const moe::MoELayerConfig& c, Device d, const Tensor& x_host, const Tensor& dy_host) {
  nn::ParamRegistry reg(DType::F32);
  moe::MoELayer layer(reg, "decoder.layers.0.mlp", c);
  reg.initialize(11);
  if (c.bias)  // the expert biases start at zero: give them values the forward shows
    for (nn::Parameter* b : {layer.experts().fc1_bias(), layer.experts().fc2_bias()})
      b->value.copy_from(host_random(b->value.shape(), 23, 0.5));
  reg.to(d);
  auto st = layer.make_stash();
  LayerRun r;
  r.y = layer.forward(x_host.to(d), *st).to(Device::cpu());
  r.aux = moe::MoELayer::aux_loss_total(*st);
  r.dx = layer.backward(dy_host.to(d), *st).to(Device::cpu());
  for (const auto& p : reg.all()) r.grads.push_back(p->grad.to(Device::cpu()));
  return r;
}

void expect_layers_agree(const moe::MoELayerConfig& c, double tol, const std::string& what) {
  const Tensor x = host_random({16, 4, 64}, 21), dy = host_random({16, 4, 64}, 22);
  const LayerRun cpu = run_layer(c, Device::cpu(), x, dy);
  const LayerRun g1 = run_layer(c, Device::cuda(), x, dy);
  EXPECT_LT(rel_diff(gpu(g1.y), cpu.y), tol) << what << ": forward output";
  EXPECT_LT(rel_diff(gpu(g1.dx), cpu.dx), tol) << what << ": input gradient";
  EXPECT_NEAR(g1.aux, cpu.aux, tol * std::max(1e-12, std::fabs(cpu.aux))) << what << ": aux + z losses";
  ASSERT_EQ(g1.grads.size(), cpu.grads.size());
  for (size_t i = 0; i < cpu.grads.size(); i++)
    EXPECT_LT(rel_diff(gpu(g1.grads[i]), cpu.grads[i]), tol) << what << ": gradient of parameter " << i;
  const LayerRun g2 = run_layer(c, Device::cuda(), x, dy);
  EXPECT_TRUE(bitwise_equal(gpu(g2.y), gpu(g1.y)) && bitwise_equal(gpu(g2.dx), gpu(g1.dx))) << what << ": GPU rerun";
}

TEST(CudaMoELayer, SoftmaxTopKMatchesTheCpu) {
  MOE_REQUIRE_GPU();
  moe::MoELayerConfig c = layer_config(false, false, false);
  c.router.aux_loss_coeff = {1e-2};
  c.router.z_loss_coeff = 1e-3;
  expect_layers_agree(c, 1e-5, "softmax top-2, aux and z losses");
}

TEST(CudaMoELayer, SigmoidGroupLimitedWithBiasAndGatedSharedExpertMatchesTheCpu) {
  MOE_REQUIRE_GPU();
  expect_layers_agree(layer_config(false, true, true), 1e-5, "sigmoid, groups, bias, gated shared expert");
}

TEST(CudaMoELayer, Bf16MatchesTheCpuWithinOnePercent) {
  MOE_REQUIRE_GPU();
  expect_layers_agree(layer_config(true, true, false), 1e-2, "bf16");
}

// Under bf16 the experts' GEMMs write bf16 (h, y, da, dx) and the combine sums bf16 rows, as on the CPU: the GPU's
// expert GEMMs agree with the CPU layer within 1e-2 (and in f32 within 1e-5).
TEST(CudaMoELayer, ExpertGemmsMatchTheCpu) {
  MOE_REQUIRE_GPU();
  expect_layers_agree(layer_config(true, false, false), 1e-2, "expert GEMMs, bf16");
  expect_layers_agree(layer_config(false, false, false), 1e-5, "expert GEMMs, f32");
}

// Megatron's --add-bias-linear: the router's gating bias and the experts' fc1 and fc2 (times the probability) biases.
TEST(CudaMoELayer, LinearBiasesMatchTheCpu) {
  MOE_REQUIRE_GPU();
  for (bool bf16 : {false, true}) {
    moe::MoELayerConfig c = layer_config(bf16, false, false);
    c.router.aux_loss_coeff = {1e-2};
    c.bias = true;
    expect_layers_agree(c, bf16 ? 1e-2 : 1e-5, bf16 ? "biases, bf16" : "biases");
  }
}

TEST(CudaMoELayer, SharedExpertOverlapOnASecondStreamChangesNoBit) {
  MOE_REQUIRE_GPU();
  moe::MoELayerConfig c = layer_config(false, true, false);
  const Tensor x = host_random({16, 4, 64}, 41), dy = host_random({16, 4, 64}, 42);
  const LayerRun serial = run_layer(c, Device::cuda(), x, dy);
  c.shared_expert_overlap = true;
  const LayerRun overlap = run_layer(c, Device::cuda(), x, dy);
  EXPECT_TRUE(bitwise_equal(gpu(overlap.y), gpu(serial.y))) << "forward output";
  EXPECT_TRUE(bitwise_equal(gpu(overlap.dx), gpu(serial.dx))) << "input gradient";
  for (size_t i = 0; i < serial.grads.size(); i++)
    EXPECT_TRUE(bitwise_equal(gpu(overlap.grads[i]), gpu(serial.grads[i]))) << "gradient of parameter " << i;
}

TEST(CudaSharedExperts, GateForwardAndBackwardMatchTheCpu) {
  MOE_REQUIRE_GPU();
  const nn::MLPConfig mc{64, 32, kernels::Activation::SwiGLU, false, 0.02, 0.02, std::nullopt, {}};
  const Tensor x = host_random({24, 2, 64}, 31), dy = host_random({24, 2, 64}, 32);
  std::vector<Tensor> y, dx, gw;
  for (Device d : {Device::cpu(), Device::cuda()}) {
    nn::ParamRegistry reg(DType::F32);
    moe::SharedExperts se(reg, "shared", mc, /*gate=*/true, /*recompute=*/false);
    reg.initialize(5);
    reg.to(d);
    auto st = se.make_stash();
    y.push_back(se.forward(x.to(d), st).to(Device::cpu()));
    dx.push_back(se.backward(dy.to(d), st).to(Device::cpu()));
    gw.push_back(reg.get("shared.gate_weight").grad.to(Device::cpu()));
  }
  EXPECT_LT(rel_diff(gpu(y[1]), y[0]), 1e-5);
  EXPECT_LT(rel_diff(gpu(dx[1]), dx[0]), 1e-5);
  EXPECT_LT(rel_diff(gpu(gw[1]), gw[0]), 1e-5);
}

}  // namespace
}  // namespace moecore
