// The MoE router on the GPU against the CPU router (moe/router.cpp over kernels/cuda/routing.cpp and over
// kernels/cpu/routing.cpp): for every option combination, the same expert ids and dropped assignments, probabilities
// within 1e-6 and aux / z-loss values within 1e-6 (relative to the largest magnitude), the same statistics and
// expert-bias counts, gradients within 1e-5; bitwise reruns; the refusals. Inputs are multiples of 2^-3 and weights
// multiples of 2^-10, so the gating GEMM is exact on both devices and only the score functions' exp/log differ by an
// ulp.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "gpu_util.h"
#include "kernel_compare.h"
#include "moecore/core/error.h"
#include "moecore/moe/router.h"

namespace moecore {
namespace {

using moe::DropPolicy;
using moe::LoadBalancingType;
using moe::Router;
using moe::RouterConfig;
using moe::ScoreFunction;
using testing_cuda::bitwise_equal;
using testing_cuda::gpu;
using testing_cuda::host_random;
using testing_cuda::rel_diff;

// Uniform values rounded to multiples of `step` (exact products and sums in f32 at these sizes).
Tensor quantized(const Shape& s, uint64_t seed, double scale, double step) {
  Tensor t = host_random(s, seed, scale);
  for (int64_t i = 0; i < t.numel(); i++) t.set_item(i, std::round(t.item(i) / step) * step);
  return t;
}

// The same router twice, one with its parameters on the GPU.
struct Pair {
  nn::ParamRegistry cpu_reg, gpu_reg;
  Router cpu, gpu;
  Pair(const RouterConfig& c, uint64_t seed) : cpu(cpu_reg, "router", c), gpu(gpu_reg, "router", c) {
    const Tensor w = quantized({c.num_experts, c.hidden}, seed, 0.25, 0x1p-10);
    cpu.weight().value.copy_from(w);
    gpu.weight().value.copy_from(w);
    cpu_reg.zero_grad();
    gpu_reg.zero_grad();
    if (c.enable_expert_bias) {
      const Tensor b = quantized({c.num_experts}, seed + 7, 0.05, 0x1p-8);
      cpu.expert_bias().copy_from(b);
      gpu.expert_bias().copy_from(b);
    }
    gpu_reg.to(Device::cuda());
  }
};

std::string describe(const RouterConfig& c) {
  std::string s = c.score_function == ScoreFunction::Sigmoid ? "sigmoid" : "softmax";
  if (c.pre_softmax) s += " pre-softmax";
  if (c.group_topk) s += " groups " + std::to_string(c.num_groups) + "/" + std::to_string(c.group_topk);
  if (c.enable_expert_bias) s += " bias";
  if (c.topk_scaling_factor > 0) s += " scaling";
  if (c.capacity_factor >= 0)
    s += std::string(" capacity ") + std::to_string(c.capacity_factor) +
         (c.drop_policy == DropPolicy::Probs ? " probs" : " position") + (c.pad_to_capacity ? " pad" : "");
  for (size_t i = 0; i < c.load_balancing.size(); i++)
    s += std::string(" ") + moe::load_balancing_name(c.load_balancing[i]);
  if (c.z_loss_coeff > 0) s += " z-loss";
  if (c.input_jitter_eps > 0) s += " jitter";
  if (c.force_load_balancing) s += " forced-balance";
  return s;
}

double rel(double got, double want) {
  return std::fabs(got - want) / std::max(std::fabs(want), 1e-30);
}

// Forward (training or not) and backward on both devices; every output compared.
void compare(Pair& p, const RouterConfig& c, int64_t S, int64_t B, bool training, uint64_t seed) {
  const std::string what = describe(c) + (training ? " (training)" : " (eval)");
  const int64_t T = S * B, K = c.topk;
  const Tensor x = quantized({T, c.hidden}, seed, 1.0, 0.125);
  Router::Stash sc, sg;
  const Router::Output oc = p.cpu.forward(x, S, B, training, sc);
  const Router::Output og = p.gpu.forward(gpu(x), S, B, training, sg);
  ASSERT_TRUE(og.idx_TK.device().is_cuda() && og.probs_TK.device().is_cuda()) << what;
  ASSERT_TRUE(sg.logits_TE.device().is_cuda() && sg.idx_TK.device().is_cuda() && sg.kept_TK.device().is_cuda()) << what;
  EXPECT_EQ(og.pad_capacity, oc.pad_capacity) << what;
  const Tensor ids = og.idx_TK.to(Device::cpu());
  int64_t id_mismatch = 0;
  for (int64_t i = 0; i < T * K; i++) id_mismatch += ids.item(i) != oc.idx_TK.item(i);
  EXPECT_EQ(id_mismatch, 0) << what << ": expert ids (−1 = dropped) differ in " << id_mismatch << " of " << T * K;
  const double dp = rel_diff(og.probs_TK, oc.probs_TK);
  EXPECT_LE(dp, 1e-6) << what << ": probabilities differ by " << dp;
  EXPECT_LE(rel(sg.aux_loss_total, sc.aux_loss_total), 1e-6)
      << what << ": aux + z loss " << sg.aux_loss_total << " vs " << sc.aux_loss_total;
  if (training) {
    const nn::RoutingStats &a = p.gpu.stats(), &b = p.cpu.stats();
    EXPECT_EQ(a.tokens_per_expert, b.tokens_per_expert) << what;
    EXPECT_EQ(a.dropped, b.dropped) << what;
    EXPECT_EQ(a.assignments, b.assignments) << what;
    EXPECT_LE(rel(a.entropy_sum, b.entropy_sum), 1e-6)
        << what << ": entropy " << a.entropy_sum << " vs " << b.entropy_sum;
    for (size_t i = 0; i < b.loss_sums.size(); i++)
      EXPECT_LE(rel(a.loss_sums[i], b.loss_sums[i]), 1e-6)
          << what << ": " << b.loss_names[i] << " " << a.loss_sums[i] << " vs " << b.loss_sums[i];
    EXPECT_LE(rel(a.z_loss_sum, b.z_loss_sum), 1e-6) << what << ": z-loss " << a.z_loss_sum << " vs " << b.z_loss_sum;
    for (int64_t e = 0; e < c.num_experts; e++)
      EXPECT_EQ(p.gpu.local_tokens_per_expert().item(e), p.cpu.local_tokens_per_expert().item(e)) << what;
  }
  // Backward: random upstream gradient on the probabilities, a loss scale on the aux terms.
  const Tensor dp_TK = host_random({T, K}, seed + 1);
  const Tensor dxc = p.cpu.backward(dp_TK, DType::F32, 0.75, sc);
  const Tensor dxg = p.gpu.backward(gpu(dp_TK), DType::F32, 0.75, sg);
  ASSERT_TRUE(dxg.device().is_cuda()) << what;
  const double ddx = rel_diff(dxg, dxc), ddw = rel_diff(p.gpu.weight().grad, p.cpu.weight().grad);
  EXPECT_LE(ddx, 1e-5) << what << ": dx differs by " << ddx;
  EXPECT_LE(ddw, 1e-5) << what << ": dW differs by " << ddw;
}

RouterConfig base(int64_t E = 16, int64_t K = 4) {
  RouterConfig c;
  c.hidden = 32;
  c.num_experts = E;
  c.topk = K;
  c.aux_loss_coeff = {0.0};
  return c;
}

// softmax / softmax pre / sigmoid / sigmoid + bias × groups × scaling × {dropless, probs, probs+pad, position,
// position+pad}, the load-balancing type and z-loss cycling through the combinations.
TEST(CudaRouter, EveryOptionCombinationMatchesTheCpu) {
  MOE_REQUIRE_GPU();
  const std::vector<std::vector<LoadBalancingType>> lb = {
      {LoadBalancingType::AuxLoss},
      {LoadBalancingType::SeqAuxLoss},
      {LoadBalancingType::GlobalAuxLoss},
      {LoadBalancingType::AuxLoss, LoadBalancingType::SeqAuxLoss, LoadBalancingType::GlobalAuxLoss},
      {LoadBalancingType::None}};
  int n = 0;
  for (int score = 0; score < 4; score++)
    for (int groups = 0; groups < 2; groups++)
      for (int scaling = 0; scaling < 2; scaling++)
        for (int cap = 0; cap < 5; cap++, n++) {
          RouterConfig c = base();
          c.score_function = score >= 2 ? ScoreFunction::Sigmoid : ScoreFunction::Softmax;
          c.pre_softmax = score == 1;
          c.enable_expert_bias = score == 3;
          if (groups) {
            c.num_groups = 4;
            c.group_topk = 2;
          }
          if (scaling) c.topk_scaling_factor = 2.5;
          if (cap) {
            c.capacity_factor = n % 2 ? 0.5 : 1.0;
            c.drop_policy = cap <= 2 ? DropPolicy::Probs : DropPolicy::Position;
            c.pad_to_capacity = cap % 2 == 0;
          }
          c.load_balancing = lb[n % lb.size()];
          c.aux_loss_coeff.assign(c.load_balancing.size(), 1e-2);
          c.z_loss_coeff = n % 3 ? 1e-3 : 0.0;
          Pair p(c, 100 + n);
          compare(p, c, 16, 4, true, 1000 + n);
          compare(p, c, 16, 4, true, 2000 + n);  // a second micro-batch: global aux counts and statistics accumulate
          compare(p, c, 8, 2, false, 3000 + n);
          if (HasFailure()) return;
        }
}

// Top-1 and a top-k that takes whole groups; more experts than a warp; ties (every logit equal: zero input).
TEST(CudaRouter, TopOneWideAndTiedRowsMatchTheCpu) {
  MOE_REQUIRE_GPU();
  for (int v = 0; v < 3; v++) {
    RouterConfig c = base(v == 1 ? 96 : 8, v == 0 ? 1 : 6);
    c.score_function = v == 0 ? ScoreFunction::Sigmoid : ScoreFunction::Softmax;
    c.pre_softmax = v == 2;
    if (v == 1) {
      c.num_groups = 8;
      c.group_topk = 3;
    }
    c.capacity_factor = 1.0;
    c.load_balancing = {LoadBalancingType::AuxLoss};
    c.aux_loss_coeff = {1e-2};
    c.z_loss_coeff = 1e-3;
    Pair p(c, 5 + v);
    compare(p, c, 32, 2, true, 50 + v);
    // Zero input: every logit ties, so top-k and the capacity ranking fall back on the lower index / earlier token.
    Router::Stash sc, sg;
    const Tensor x = Tensor::zeros({16, c.hidden}, DType::F32);
    const auto oc = p.cpu.forward(x, 16, 1, true, sc);
    const auto og = p.gpu.forward(gpu(x), 16, 1, true, sg);
    EXPECT_TRUE(bitwise_equal(og.idx_TK, gpu(oc.idx_TK))) << describe(c) << ": tied rows route differently";
    EXPECT_LE(rel_diff(og.probs_TK, oc.probs_TK), 1e-6) << describe(c);
  }
}

// Jitter and forced-balance noise are drawn on the host with the CPU's streams: the same routing.
TEST(CudaRouter, JitterAndForcedBalanceMatchTheCpu) {
  MOE_REQUIRE_GPU();
  for (int v = 0; v < 2; v++) {
    RouterConfig c = base();
    c.input_jitter_eps = v == 0 ? 1e-2 : 0.0;
    c.force_load_balancing = v == 1;
    c.load_balancing = {LoadBalancingType::AuxLoss};
    c.aux_loss_coeff = {1e-2};
    c.z_loss_coeff = 1e-3;
    Pair p(c, 11 + v);
    // Jittered inputs are not exact multiples any more: the GEMM may round differently (ids checked, probs 1e-6).
    compare(p, c, 16, 2, true, 60 + v);
    compare(p, c, 16, 2, true, 70 + v);  // the next forward draws the next noise
  }
}

// bf16 activations: the gating input is converted to f32 on the GPU, dx returned in bf16 (values exact in bf16).
TEST(CudaRouter, Bf16InputMatchesTheCpu) {
  MOE_REQUIRE_GPU();
  RouterConfig c = base();
  c.load_balancing = {LoadBalancingType::AuxLoss};
  c.aux_loss_coeff = {1e-2};
  c.z_loss_coeff = 1e-3;
  c.capacity_factor = 1.0;
  Pair p(c, 15);
  const Tensor x = quantized({32, c.hidden}, 16, 1.0, 0.125).to(DType::BF16);
  Router::Stash sc, sg;
  const auto oc = p.cpu.forward(x, 16, 2, true, sc);
  const auto og = p.gpu.forward(gpu(x), 16, 2, true, sg);
  EXPECT_TRUE(bitwise_equal(og.idx_TK, gpu(oc.idx_TK)));
  EXPECT_LE(rel_diff(og.probs_TK, oc.probs_TK), 1e-6);
  const Tensor dp = host_random({32, c.topk}, 17);
  const Tensor dxc = p.cpu.backward(dp, DType::BF16, 1.0, sc), dxg = p.gpu.backward(gpu(dp), DType::BF16, 1.0, sg);
  ASSERT_EQ(dxg.dtype(), DType::BF16);
  const double d = rel_diff(dxg, dxc);
  EXPECT_LE(d, 1e-2) << "bf16 dx differs by " << d;  // one bf16 rounding of values within 1e-5 of each other
  const double dw = rel_diff(p.gpu.weight().grad, p.cpu.weight().grad);
  EXPECT_LE(dw, 1e-5) << "dW differs by " << dw;
}

// A recompute replays the recorded forward: same noise, same global-aux counts, nothing counted twice.
TEST(CudaRouter, RecomputeReplayMatchesTheCpu) {
  MOE_REQUIRE_GPU();
  RouterConfig c = base();
  c.load_balancing = {LoadBalancingType::GlobalAuxLoss};
  c.aux_loss_coeff = {1e-2};
  c.input_jitter_eps = 1e-2;
  Pair p(c, 21);
  const Tensor x = quantized({32, c.hidden}, 22, 1.0, 0.125);
  Router::Stash sc, sg;
  p.cpu.forward(x, 16, 2, true, sc);
  p.gpu.forward(gpu(x), 16, 2, true, sg);
  Router::Stash rc, rg;
  rc.replay = sc.replay;
  rc.recompute = true;
  rg.replay = sg.replay;
  rg.recompute = true;
  const auto oc = p.cpu.forward(x, 16, 2, true, rc);
  const auto og = p.gpu.forward(gpu(x), 16, 2, true, rg);
  EXPECT_TRUE(bitwise_equal(og.idx_TK, gpu(oc.idx_TK)));
  EXPECT_LE(rel_diff(og.probs_TK, oc.probs_TK), 1e-6);
  EXPECT_LE(rel(rg.aux_loss_total, rc.aux_loss_total), 1e-6) << rg.aux_loss_total << " vs " << rc.aux_loss_total;
  EXPECT_EQ(p.gpu.stats().micro_batches, 1);
  EXPECT_EQ(p.gpu.forward_count(), p.cpu.forward_count());
}

// The expert bias lives on the GPU and moves once per global batch as on the CPU.
TEST(CudaRouter, ExpertBiasUpdateMatchesTheCpu) {
  MOE_REQUIRE_GPU();
  RouterConfig c = base();
  c.score_function = ScoreFunction::Sigmoid;
  c.enable_expert_bias = true;
  c.bias_update_rate = 1e-2;
  Pair p(c, 31);
  for (int step = 0; step < 3; step++) {
    compare(p, c, 16, 2, true, 300 + step);
    compare(p, c, 16, 2, true, 400 + step);
    p.cpu.finish_global_batch();
    p.gpu.finish_global_batch();
    ASSERT_TRUE(p.gpu.expert_bias().device().is_cuda());
    EXPECT_TRUE(bitwise_equal(p.gpu.expert_bias(), gpu(p.cpu.expert_bias()))) << "step " << step;
    EXPECT_EQ(p.gpu.last_global_batch().tokens_per_expert, p.cpu.last_global_batch().tokens_per_expert);
    EXPECT_EQ(p.gpu.local_tokens_per_expert().item(0), 0.0);
  }
}

// Same inputs, same bits: two identical GPU routers, forward and backward.
TEST(CudaRouter, RerunIsBitwiseIdentical) {
  MOE_REQUIRE_GPU();
  RouterConfig c = base();
  c.score_function = ScoreFunction::Sigmoid;
  c.enable_expert_bias = true;
  c.num_groups = 4;
  c.group_topk = 2;
  c.capacity_factor = 0.5;
  c.load_balancing = {LoadBalancingType::AuxLoss, LoadBalancingType::SeqAuxLoss};
  c.aux_loss_coeff = {1e-2, 1e-2};
  c.z_loss_coeff = 1e-3;
  c.input_jitter_eps = 1e-2;
  Pair a(c, 41), b(c, 41);
  const Tensor x = gpu(host_random({256, c.hidden}, 42)), dp = gpu(host_random({256, c.topk}, 43));
  Router::Stash sa, sb;
  const auto oa = a.gpu.forward(x, 64, 4, true, sa);
  const auto ob = b.gpu.forward(x, 64, 4, true, sb);
  EXPECT_TRUE(bitwise_equal(oa.idx_TK, ob.idx_TK));
  EXPECT_TRUE(bitwise_equal(oa.probs_TK, ob.probs_TK));
  EXPECT_EQ(sa.aux_loss_total, sb.aux_loss_total);
  const Tensor da = a.gpu.backward(dp, DType::F32, 1.0, sa), db = b.gpu.backward(dp, DType::F32, 1.0, sb);
  EXPECT_TRUE(bitwise_equal(da, db));
  EXPECT_TRUE(bitwise_equal(a.gpu.weight().grad, b.gpu.weight().grad));
}

// An fp64 router dtype is refused on the GPU by name; Sinkhorn's training routing (its cost on a host copy, top-k on
// the GPU) and evaluation (the activation alone) match the CPU.
TEST(CudaRouter, RefusesFp64AndRoutesSinkhornLikeTheCpu) {
  MOE_REQUIRE_GPU();
  RouterConfig c = base();
  c.router_dtype = DType::F64;
  Pair p(c, 51);
  Router::Stash st;
  const Tensor x = gpu(host_random({8, c.hidden}, 52));
  try {
    p.gpu.forward(x, 8, 1, true, st);
    ADD_FAILURE() << "an fp64 router dtype on the GPU was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("is not supported by moecore on the GPU"), std::string::npos) << e.what();
  }
  RouterConfig s = base();
  s.load_balancing = {LoadBalancingType::Sinkhorn};
  s.aux_loss_coeff = {0.0};
  Pair q(s, 53);
  compare(q, s, 8, 2, /*training=*/true, 54);
  compare(q, s, 8, 2, /*training=*/false, 55);
}

}  // namespace
}  // namespace moecore
